//! Every kind of bad argument to put / put_batch / get / look_by_offset /
//! look_by_msg_id gets its exact status or result, and afterwards the store still
//! serves: a good put and get succeed and previously stored data is intact.
//!
//! Each case runs under `catch_unwind`, so a panic inside the store is reported as
//! that case's failure and the table goes on; all failures are listed at the end.
#[path = "common/child.rs"]
mod child;
mod common;

use child::run_ret;
use common::run;
use coremq::format::properties;
use coremq::{
    FlushMode, GetStatus, IllegalReason, Message, PutStatus, Store, StoreConfig, StoredMessage,
};
use futures_lite::FutureExt;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::time::Duration;

use IllegalReason::*;
use PutStatus::*;

fn cfg(root: &Path) -> StoreConfig {
    let mut c = StoreConfig::small_for_tests(root);
    c.flush_mode = FlushMode::Sync;
    c
}

/// A message the store accepted, to re-check later.
#[derive(Debug, Clone)]
struct Kept {
    topic: String,
    q: i32,
    qoff: u64,
    log_off: u64,
    body: Vec<u8>,
}

fn msg(topic: &str, q: i32, body: impl Into<Vec<u8>>) -> Message {
    Message::new(topic, q, body.into())
        .with_tags("t")
        .with_keys("k")
}

fn good(i: u64) -> Message {
    msg("Good", (i % 2) as i32, format!("good message {i}"))
}

async fn catch<T>(f: impl std::future::Future<Output = T>) -> Result<T, String> {
    AssertUnwindSafe(f).catch_unwind().await.map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .map(|s| format!("panicked: {s}"))
            .unwrap_or_else(|| "panicked".into())
    })
}

/// The store still serves: a good put lands where expected and can be read back, and
/// every message kept so far is intact.
async fn still_serves(store: &Store, kept: &mut Vec<Kept>, n: &mut u64) -> Result<(), String> {
    let m = good(*n);
    *n += 1;
    let expect_q = store.max_queue_offset(&m.topic, m.queue_id);
    let r = store.put(m.clone()).await;
    if r.status != PutOk {
        return Err(format!(
            "good put got {:?} (store failure: {:?})",
            r.status,
            store.failure()
        ));
    }
    if r.queue_offset != expect_q {
        return Err(format!(
            "good put got queue offset {}, expected {expect_q}",
            r.queue_offset
        ));
    }
    kept.push(Kept {
        topic: m.topic.clone(),
        q: m.queue_id,
        qoff: r.queue_offset,
        log_off: r.log_offset,
        body: m.body.to_vec(),
    });
    wait_visible(store).await?;
    check_kept(store, kept).await
}

async fn wait_visible(store: &Store) -> Result<(), String> {
    futures_lite::future::or(
        async {
            store.wait_dispatched().await;
            Ok(())
        },
        async {
            glommio::timer::sleep(Duration::from_secs(10)).await;
            Err(format!(
                "records not visible within 10 s (store failure: {:?})",
                store.failure()
            ))
        },
    )
    .await
}

async fn check_kept(store: &Store, kept: &[Kept]) -> Result<(), String> {
    for k in kept {
        let g = store
            .get(&k.topic, k.q, k.qoff, 1, 1 << 20)
            .await
            .map_err(|e| e.to_string())?;
        if g.status != GetStatus::Found {
            return Err(format!(
                "{}/{} queue offset {}: {:?}",
                k.topic, k.q, k.qoff, g.status
            ));
        }
        let m = StoredMessage::decode(&g.records[0])
            .map_err(|e| format!("{}/{}: {e}", k.topic, k.q))?;
        if m.log_offset != k.log_off || m.body[..] != k.body[..] || m.topic != k.topic {
            return Err(format!(
                "{}/{} queue offset {}: different message",
                k.topic, k.q, k.qoff
            ));
        }
    }
    Ok(())
}

fn props_of(value_len: usize) -> Vec<(String, String)> {
    vec![("P".to_string(), "v".repeat(value_len))]
}

#[test]
fn bad_arguments_get_exact_statuses_and_the_store_keeps_serving() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("s");
    let root2 = root.clone();
    let kept = run_ret(move || async move {
        let root = root2;
        let store = Store::open(cfg(&root)).await.unwrap();
        let max_body = store.config().max_message_bytes;
        let max_batch = store.config().max_batch_messages;
        let mut kept: Vec<Kept> = Vec::new();
        let mut n = 0u64;
        for _ in 0..6 {
            still_serves(&store, &mut kept, &mut n).await.unwrap();
        }
        let mut failures: Vec<String> = Vec::new();

        // ---- put ------------------------------------------------------------
        // Largest properties region: "P" 0x01 value 0x02 plus the 20-byte record-CRC
        // property must fit in 32767 bytes.
        let props_max = properties::CRC32_RESERVED_LEN + 3;
        let fit = 32767 - props_max;
        let crc_prop = msg("Props", 0, "x").with_property(properties::CRC32, "0000000000");
        let put_cases: Vec<(&str, Message, PutStatus)> = vec![
            ("empty topic", msg("", 0, "x"), MessageIllegal(TopicEmpty)),
            ("127-char topic", msg(&"a".repeat(127), 0, "x"), PutOk),
            (
                "128-char topic",
                msg(&"a".repeat(128), 0, "x"),
                MessageIllegal(TopicTooLong),
            ),
            (
                "255-char %RETRY% topic",
                msg(&format!("%RETRY%{}", "r".repeat(248)), 0, "x"),
                PutOk,
            ),
            (
                "256-char %RETRY% topic",
                msg(&format!("%RETRY%{}", "r".repeat(249)), 0, "x"),
                MessageIllegal(TopicTooLong),
            ),
            (
                "topic with '/'",
                msg("a/b", 0, "x"),
                MessageIllegal(TopicInvalidChars),
            ),
            (
                "topic with '.'",
                msg("a.b", 0, "x"),
                MessageIllegal(TopicInvalidChars),
            ),
            (
                "topic '..'",
                msg("..", 0, "x"),
                MessageIllegal(TopicInvalidChars),
            ),
            (
                "topic with a space",
                msg("a b", 0, "x"),
                MessageIllegal(TopicInvalidChars),
            ),
            (
                "topic with NUL",
                msg("a\0b", 0, "x"),
                MessageIllegal(TopicInvalidChars),
            ),
            (
                "non-ASCII topic",
                msg("tópico", 0, "x"),
                MessageIllegal(TopicInvalidChars),
            ),
            (
                "queue id -1",
                msg("Q", -1, "x"),
                MessageIllegal(QueueIdOutOfRange),
            ),
            (
                "queue id i32::MIN",
                msg("Q", i32::MIN, "x"),
                MessageIllegal(QueueIdOutOfRange),
            ),
            (
                "queue id i32::MAX",
                msg("Q", i32::MAX, "x"),
                MessageIllegal(QueueIdOutOfRange),
            ),
            (
                "queue id 65536",
                msg("Q", 65_536, "x"),
                MessageIllegal(QueueIdOutOfRange),
            ),
            ("queue id 65535", msg("Q", 65_535, "x"), PutOk),
            (
                "body of max_message_bytes + 1",
                msg("Big", 0, vec![7u8; max_body + 1]),
                MessageIllegal(BodyTooLarge),
            ),
            (
                "body of exactly max_message_bytes",
                msg("Big", 0, vec![7u8; max_body]),
                PutOk,
            ),
            ("empty body", msg("Big", 1, Vec::new()), PutOk),
            (
                "properties of exactly 32767 bytes",
                Message {
                    properties: props_of(fit),
                    ..Message::new("Props", 0, "x")
                },
                PutOk,
            ),
            (
                "properties of 32768 bytes",
                Message {
                    properties: props_of(fit + 1),
                    ..Message::new("Props", 0, "x")
                },
                PropertiesSizeExceeded,
            ),
            (
                "many properties over 32767 bytes",
                Message {
                    properties: (0..2000)
                        .map(|i| (format!("name{i}"), "value-value".to_string()))
                        .collect(),
                    ..Message::new("Props", 0, "x")
                },
                PropertiesSizeExceeded,
            ),
            (
                "property value with \\u{1}",
                msg("Props", 0, "x").with_property("A", "x\u{1}y"),
                MessageIllegal(PropertyInvalid),
            ),
            (
                "property value with \\u{2}",
                msg("Props", 0, "x").with_property("A", "x\u{2}y"),
                MessageIllegal(PropertyInvalid),
            ),
            (
                "property name with \\u{1}",
                msg("Props", 0, "x").with_property("A\u{1}", "y"),
                MessageIllegal(PropertyInvalid),
            ),
            (
                "empty property name",
                msg("Props", 0, "x").with_property("", "y"),
                MessageIllegal(PropertyInvalid),
            ),
            ("caller-supplied __CRC32# property", crc_prop, PutOk),
        ];
        for (name, m, want) in put_cases {
            let queues_before = store.queues();
            let log_before = store.max_log_offset();
            let r = match catch(store.put(m.clone())).await {
                Ok(r) => r,
                Err(p) => {
                    failures.push(format!("put, {name}: {p}"));
                    continue;
                }
            };
            if r.status != want {
                failures.push(format!(
                    "put, {name}: got {:?}, expected {want:?}",
                    r.status
                ));
            }
            if want == PutOk && r.status == PutOk {
                if let Err(e) = wait_visible(&store).await {
                    failures.push(format!("put, {name}: {e}"));
                    continue;
                }
                kept.push(Kept {
                    topic: m.topic.clone(),
                    q: m.queue_id,
                    qoff: r.queue_offset,
                    log_off: r.log_offset,
                    body: m.body.to_vec(),
                });
                if let Err(e) = check_kept(&store, &kept[kept.len() - 1..]).await {
                    failures.push(format!("put, {name}: accepted but not readable: {e}"));
                }
            } else if want != PutOk {
                if store.queues() != queues_before {
                    failures.push(format!(
                        "put, {name}: a refused put created a queue: {:?}",
                        store.queues()
                    ));
                }
                if store.max_log_offset() != log_before {
                    failures.push(format!("put, {name}: a refused put wrote to the log"));
                }
            }
            if let Err(e) = still_serves(&store, &mut kept, &mut n).await {
                failures.push(format!("after put, {name}: {e}"));
            }
        }

        // ---- put_batch --------------------------------------------------------
        let mut tx = msg("Batch", 0, "half");
        tx.sys_flag = 0x4; // TRANSACTION_PREPARED
        let batch_cases: Vec<(&str, Vec<Message>, PutStatus)> = vec![
            ("empty batch", vec![], MessageIllegal(BatchInvalid)),
            (
                "batch mixing queues",
                vec![msg("Batch", 0, "a"), msg("Batch", 1, "b")],
                MessageIllegal(BatchInvalid),
            ),
            (
                "batch mixing topics",
                vec![msg("Batch", 0, "a"), msg("Batch2", 0, "b")],
                MessageIllegal(BatchInvalid),
            ),
            (
                "batch over max_batch_messages",
                (0..=max_batch)
                    .map(|i| msg("Batch", 0, format!("{i}")))
                    .collect(),
                MessageIllegal(BatchInvalid),
            ),
            (
                "batch with a transaction flag",
                vec![msg("Batch", 0, "a"), tx],
                MessageIllegal(BatchTransaction),
            ),
            (
                "batch with a bad property",
                vec![
                    msg("Batch", 0, "a"),
                    msg("Batch", 0, "b").with_property("A", "\u{1}"),
                ],
                MessageIllegal(PropertyInvalid),
            ),
            (
                "batch with a bad queue id",
                vec![msg("Batch", -1, "a"), msg("Batch", -1, "b")],
                MessageIllegal(QueueIdOutOfRange),
            ),
            (
                "batch with a body over the limit",
                vec![
                    msg("Batch", 0, "a"),
                    msg("Batch", 0, vec![1u8; max_body + 1]),
                ],
                MessageIllegal(BodyTooLarge),
            ),
            (
                "batch whose total exceeds the largest record",
                (0..3)
                    .map(|_| msg("Batch", 0, vec![2u8; max_body - 10]))
                    .collect(),
                MessageIllegal(BodyTooLarge),
            ),
            (
                "good batch",
                (0..3)
                    .map(|i| msg("Batch", 0, format!("batch {i}")))
                    .collect(),
                PutOk,
            ),
        ];
        for (name, msgs, want) in batch_cases {
            let queues_before = store.queues();
            let log_before = store.max_log_offset();
            let expect_q = if msgs.is_empty() {
                0
            } else {
                store.max_queue_offset(&msgs[0].topic, msgs[0].queue_id)
            };
            let r = match catch(store.put_batch(&msgs)).await {
                Ok(r) => r,
                Err(p) => {
                    failures.push(format!("put_batch, {name}: {p}"));
                    continue;
                }
            };
            if r.status != want {
                failures.push(format!(
                    "put_batch, {name}: got {:?}, expected {want:?}",
                    r.status
                ));
            }
            if want == PutOk && r.status == PutOk {
                if r.queue_offset != expect_q || r.msg_ids.len() != msgs.len() {
                    failures.push(format!(
                        "put_batch, {name}: queue offset {} ids {}",
                        r.queue_offset,
                        r.msg_ids.len()
                    ));
                }
                if let Err(e) = wait_visible(&store).await {
                    failures.push(format!("put_batch, {name}: {e}"));
                    continue;
                }
                for (i, m) in msgs.iter().enumerate() {
                    kept.push(Kept {
                        topic: m.topic.clone(),
                        q: m.queue_id,
                        qoff: r.queue_offset + i as u64,
                        log_off: r.msg_ids[i].offset,
                        body: m.body.to_vec(),
                    });
                }
                if let Err(e) = check_kept(&store, &kept[kept.len() - msgs.len()..]).await {
                    failures.push(format!("put_batch, {name}: accepted but not readable: {e}"));
                }
            } else if want != PutOk {
                if store.queues() != queues_before {
                    failures.push(format!(
                        "put_batch, {name}: a refused batch created a queue: {:?}",
                        store.queues()
                    ));
                }
                if store.max_log_offset() != log_before {
                    failures.push(format!(
                        "put_batch, {name}: a refused batch wrote to the log"
                    ));
                }
            }
            if let Err(e) = still_serves(&store, &mut kept, &mut n).await {
                failures.push(format!("after put_batch, {name}: {e}"));
            }
        }

        // ---- get ----------------------------------------------------------------
        let max0 = store.max_queue_offset("Good", 0);
        assert!(max0 > 5);
        let retry = format!("%RETRY%{}", "r".repeat(248));
        // (name, topic, queue, offset, max_count, max_bytes, status, next_begin, records)
        type GetCase<'a> = (
            &'a str,
            &'a str,
            i32,
            u64,
            usize,
            usize,
            GetStatus,
            Option<u64>,
            Option<usize>,
        );
        let get_cases: Vec<GetCase> = vec![
            (
                "unknown topic",
                "NoSuchTopic",
                0,
                0,
                32,
                1 << 20,
                GetStatus::NoMatchedLogicQueue,
                Some(0),
                Some(0),
            ),
            (
                "unknown queue of a known topic",
                "Good",
                5,
                0,
                32,
                1 << 20,
                GetStatus::NoMatchedLogicQueue,
                Some(0),
                Some(0),
            ),
            (
                "queue id -1",
                "Good",
                -1,
                0,
                32,
                1 << 20,
                GetStatus::NoMatchedLogicQueue,
                Some(0),
                Some(0),
            ),
            (
                "empty topic",
                "",
                0,
                0,
                32,
                1 << 20,
                GetStatus::NoMatchedLogicQueue,
                Some(0),
                Some(0),
            ),
            (
                "topic of a refused put",
                "a/b",
                0,
                0,
                32,
                1 << 20,
                GetStatus::NoMatchedLogicQueue,
                Some(0),
                Some(0),
            ),
            (
                "offset == max",
                "Good",
                0,
                max0,
                32,
                1 << 20,
                GetStatus::OffsetOverflowOne,
                Some(max0),
                Some(0),
            ),
            (
                "offset == max + 1",
                "Good",
                0,
                max0 + 1,
                32,
                1 << 20,
                GetStatus::OffsetOverflowBadly,
                Some(max0),
                Some(0),
            ),
            (
                "offset u64::MAX",
                "Good",
                0,
                u64::MAX,
                32,
                1 << 20,
                GetStatus::OffsetOverflowBadly,
                Some(max0),
                Some(0),
            ),
            (
                "offset i64::MAX",
                "Good",
                0,
                i64::MAX as u64,
                32,
                1 << 20,
                GetStatus::OffsetOverflowBadly,
                Some(max0),
                Some(0),
            ),
            (
                "max_count 0 still returns one",
                "Good",
                0,
                0,
                0,
                1 << 20,
                GetStatus::Found,
                Some(1),
                Some(1),
            ),
            (
                "max_bytes 0 still returns one",
                "Good",
                0,
                0,
                32,
                0,
                GetStatus::Found,
                Some(1),
                Some(1),
            ),
            (
                "max_count usize::MAX",
                "Good",
                0,
                0,
                usize::MAX,
                usize::MAX,
                GetStatus::Found,
                Some(max0),
                None,
            ),
            (
                "255-char %RETRY% topic",
                &retry,
                0,
                0,
                32,
                1 << 20,
                GetStatus::Found,
                Some(1),
                Some(1),
            ),
        ];
        for (name, topic, q, off, count, bytes, want, next, nrec) in get_cases {
            let r = match catch(store.get(topic, q, off, count, bytes)).await {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => {
                    failures.push(format!("get, {name}: error {e}"));
                    continue;
                }
                Err(p) => {
                    failures.push(format!("get, {name}: {p}"));
                    continue;
                }
            };
            if r.status != want {
                failures.push(format!(
                    "get, {name}: got {:?}, expected {want:?}",
                    r.status
                ));
            }
            if let Some(next) = next
                && r.next_begin_offset != next
            {
                failures.push(format!(
                    "get, {name}: next_begin_offset {} expected {next}",
                    r.next_begin_offset
                ));
            }
            if let Some(nrec) = nrec
                && r.records.len() != nrec
            {
                failures.push(format!(
                    "get, {name}: {} records, expected {nrec}",
                    r.records.len()
                ));
            }
            for raw in &r.records {
                if let Err(e) = StoredMessage::decode(raw) {
                    failures.push(format!(
                        "get, {name}: returned a record that does not decode: {e}"
                    ));
                }
            }
        }
        if let Err(e) = still_serves(&store, &mut kept, &mut n).await {
            failures.push(format!("after the get cases: {e}"));
        }

        // ---- look_by_offset -----------------------------------------------------
        let first = kept[0].log_off;
        let end = store.max_log_offset();
        let lookups: Vec<(&str, u64)> = vec![
            ("offset 1", first + 1),
            ("inside the first record", first + 50),
            ("max_log_offset", end),
            ("max_log_offset + 1", end + 1),
            ("far past the end", end + (1 << 30)),
            ("i64::MAX", i64::MAX as u64),
            ("u64::MAX - 100", u64::MAX - 100),
            // u64::MAX - 1 and u64::MAX: see look_by_offset_near_u64_max_returns_none.
        ];
        for (name, off) in lookups {
            match catch(store.look_by_offset(off)).await {
                Ok(Ok(None)) => {}
                Ok(Ok(Some(m))) => failures.push(format!(
                    "look_by_offset, {name} ({off}): found {}/{}",
                    m.topic, m.queue_id
                )),
                Ok(Err(e)) => failures.push(format!("look_by_offset, {name} ({off}): error {e}")),
                Err(p) => failures.push(format!("look_by_offset, {name} ({off}): {p}")),
            }
        }
        match store.look_by_offset(first).await {
            Ok(Some(m)) if m.body[..] == kept[0].body[..] => {}
            other => failures.push(format!("look_by_offset of a real record: {other:?}")),
        }
        if let Err(e) = still_serves(&store, &mut kept, &mut n).await {
            failures.push(format!("after the look_by_offset cases: {e}"));
        }

        // ---- look_by_msg_id ---------------------------------------------------------
        let real_id = store
            .look_by_offset(first)
            .await
            .unwrap()
            .unwrap()
            .msg_id
            .unwrap()
            .to_string();
        let host = &real_id[..16];
        let ids: Vec<(&str, String)> = vec![
            ("empty", String::new()),
            ("short", "xyz".into()),
            ("32 non-hex characters", "G".repeat(32)),
            ("31 hex characters", real_id[..31].to_string()),
            ("33 hex characters", format!("{real_id}0")),
            ("id with a trailing space", format!("{} ", &real_id[..31])),
            ("32 bytes of non-ASCII", "é".repeat(16)),
            ("16 multi-byte characters", "ab".repeat(8) + &"é".repeat(8)),
            (
                "offset inside a record",
                format!("{host}{:016X}", first + 1),
            ),
            ("offset past the end", format!("{host}{:016X}", end + 4096)),
            ("offset i64::MIN", format!("{host}8{}", "0".repeat(15))),
            // '+' signs and offset -1: see look_by_msg_id_rejects_signs_and_huge_offsets.
        ];
        for (name, id) in &ids {
            match catch(store.look_by_msg_id(id)).await {
                Ok(Ok(None)) => {}
                Ok(Ok(Some(m))) => failures.push(format!(
                    "look_by_msg_id, {name} ({id:?}): found {}/{} at {}",
                    m.topic, m.queue_id, m.log_offset
                )),
                Ok(Err(e)) => failures.push(format!("look_by_msg_id, {name} ({id:?}): error {e}")),
                Err(p) => failures.push(format!("look_by_msg_id, {name} ({id:?}): {p}")),
            }
        }
        for id in [real_id.clone(), real_id.to_lowercase()] {
            match store.look_by_msg_id(&id).await {
                Ok(Some(m)) if m.body[..] == kept[0].body[..] => {}
                other => failures.push(format!("look_by_msg_id of a real id {id}: {other:?}")),
            }
        }
        if let Err(e) = still_serves(&store, &mut kept, &mut n).await {
            failures.push(format!("after the look_by_msg_id cases: {e}"));
        }

        // ---- after shutdown -----------------------------------------------------------
        let clone = store.clone();
        store.shutdown().await.unwrap();
        let r = clone.put(good(1000)).await;
        if r.status != ServiceNotAvailable {
            failures.push(format!("put on a clone after shutdown: got {:?}", r.status));
        }
        let r = clone.put_batch(&[good(1001), good(1003)]).await;
        if r.status != ServiceNotAvailable {
            failures.push(format!(
                "put_batch on a clone after shutdown: got {:?}",
                r.status
            ));
        }
        let r = clone.put(msg("", 0, "x")).await;
        if r.status != MessageIllegal(TopicEmpty) && r.status != ServiceNotAvailable {
            failures.push(format!(
                "bad put on a clone after shutdown: got {:?}",
                r.status
            ));
        }
        drop(clone);
        assert!(
            failures.is_empty(),
            "{} failures:\n{}",
            failures.len(),
            failures.join("\n")
        );
        kept
    });
    // Everything accepted is still there after a restart; nothing refused is.
    run(move || async move {
        let store = Store::open(cfg(&root)).await.expect("reopen");
        assert!(store.report.clean_shutdown);
        check_kept(&store, &kept).await.unwrap();
        let mut queues: Vec<(String, i32)> = kept.iter().map(|k| (k.topic.clone(), k.q)).collect();
        queues.sort();
        queues.dedup();
        assert_eq!(store.queues(), queues, "queues after restart");
        for (t, q) in &queues {
            let count = kept.iter().filter(|k| &k.topic == t && k.q == *q).count() as u64;
            assert_eq!(
                store.max_queue_offset(t, *q),
                count,
                "{t}/{q}: a refused put left a record"
            );
        }
        store.shutdown().await.unwrap();
    });
}

/// A put carrying a prepared (or rolled-back) transaction sysflag is stored but never
/// enters a ConsumeQueue; RocketMQ gives such records queue offset 0 and does not
/// advance the queue. The queue must keep working: the next normal message gets the
/// next consumable offset, dispatch does not stall, and a restart agrees.
#[test]
fn transaction_sysflag_put_keeps_the_queue_working() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("s");
    let root2 = root.clone();
    run(move || async move {
        let root = root2;
        let store = Store::open(cfg(&root)).await.unwrap();
        let mut kept = Vec::new();
        let mut n = 0;
        still_serves(&store, &mut kept, &mut n).await.unwrap();
        for (name, flag) in [("prepared", 0x4), ("rollback", 0xC)] {
            let mut m = msg("Good", 0, format!("{name} half message"));
            m.sys_flag = flag;
            let r = store.put(m).await;
            assert_eq!(r.status, PutOk, "{name}");
            let r = store.put(msg("Good", 0, format!("after {name}"))).await;
            assert_eq!(r.status, PutOk, "normal put after a {name} put");
            wait_visible(&store).await.unwrap();
            assert_eq!(
                store.failure(),
                None,
                "the store stopped after a {name} put"
            );
            let got = store.get("Good", 0, 0, 32, 1 << 20).await.unwrap();
            let bodies: Vec<String> = got
                .records
                .iter()
                .map(|raw| {
                    String::from_utf8_lossy(&StoredMessage::decode(raw).unwrap().body).into_owned()
                })
                .collect();
            assert!(
                bodies.last().is_some_and(|b| b == &format!("after {name}")),
                "queue Good/0 after a {name} put: {bodies:?}"
            );
            assert_eq!(
                store.max_queue_offset("Good", 0),
                bodies.len() as u64,
                "Good/0 has a hole"
            );
        }
        still_serves(&store, &mut kept, &mut n).await.unwrap();
        store.shutdown().await.unwrap();
        let store = Store::open(cfg(&root)).await.unwrap();
        check_kept(&store, &kept).await.unwrap();
        store.shutdown().await.unwrap();
    });
}

/// Runs `cases` of look-ups against a store holding a record at log offset 0; each
/// must return `Ok(None)` without panicking. Returns the failures.
fn lookups_return_none(cases: Vec<(&'static str, Lookup)>) -> Vec<String> {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("s");
    run_ret(move || async move {
        let store = Store::open(cfg(&root)).await.unwrap();
        let mut kept = Vec::new();
        let mut n = 0;
        still_serves(&store, &mut kept, &mut n).await.unwrap();
        assert_eq!(kept[0].log_off, 0);
        let mut failures = Vec::new();
        for (name, lookup) in cases {
            let r = match &lookup {
                Lookup::Offset(off) => catch(store.look_by_offset(*off)).await,
                Lookup::Id(id) => catch(store.look_by_msg_id(id)).await,
            };
            match r {
                Ok(Ok(None)) => {}
                Ok(Ok(Some(m))) => failures.push(format!(
                    "{name} ({lookup:?}): found {}/{} at {}",
                    m.topic, m.queue_id, m.log_offset
                )),
                Ok(Err(e)) => failures.push(format!("{name} ({lookup:?}): error {e}")),
                Err(p) => failures.push(format!("{name} ({lookup:?}): {p}")),
            }
            if let Err(e) = still_serves(&store, &mut kept, &mut n).await {
                failures.push(format!("after {name}: {e}"));
            }
        }
        store.shutdown().await.unwrap();
        failures
    })
}

#[derive(Debug)]
enum Lookup {
    Offset(u64),
    Id(String),
}

/// `look_by_offset` takes any u64 (message ids come from clients): offsets near
/// u64::MAX must be "no record", not an arithmetic overflow.
#[test]
fn look_by_offset_near_u64_max_returns_none() {
    let f = lookups_return_none(vec![
        ("u64::MAX - 90", Lookup::Offset(u64::MAX - 90)),
        ("u64::MAX - 1", Lookup::Offset(u64::MAX - 1)),
        ("u64::MAX", Lookup::Offset(u64::MAX)),
    ]);
    assert!(f.is_empty(), "{}", f.join("\n"));
}

/// A message id is exactly 32 hex digits. `u8::from_str_radix` also accepts a leading
/// '+', so "+0+0..." must not parse as an id (it names the record at offset 0); an id
/// whose offset field is negative (FFFF...) must be "no record", not a panic.
#[test]
fn look_by_msg_id_rejects_signs_and_huge_offsets() {
    let host = "7F00000100002A9F";
    let f = lookups_return_none(vec![
        ("'+' signs", Lookup::Id("+0".repeat(16))),
        (
            "'+' sign in the offset",
            Lookup::Id(format!("{host}+0{}", "0".repeat(14))),
        ),
        (
            "'+' sign in the host",
            Lookup::Id(format!("+F{}{}", &host[2..], "0".repeat(16))),
        ),
        ("offset -1", Lookup::Id(format!("{host}{}", "F".repeat(16)))),
        (
            "offset -2",
            Lookup::Id(format!("{host}{}E", "F".repeat(15))),
        ),
    ]);
    assert!(f.is_empty(), "{}", f.join("\n"));
}

/// The query calls the first table does not cover — queue offsets, offset by time,
/// earliest time, key queries, flush/checkpoint after shutdown — with every kind of
/// bad argument: each gets its exact answer or error, and the store keeps serving.
#[test]
fn query_calls_with_bad_arguments_get_exact_answers() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    run(move || async move {
        let store = Store::open(cfg(&root)).await.unwrap();
        let mut kept = Vec::new();
        let mut n = 0;
        for _ in 0..3 {
            still_serves(&store, &mut kept, &mut n).await.unwrap();
        }
        let (topic, q) = ("Good", 0);
        let mut failures: Vec<String> = Vec::new();
        let mut expect = |name: &str, ok: bool, got: String| {
            if !ok {
                failures.push(format!("{name}: got {got}"));
            }
        };
        let max = store.max_queue_offset(topic, q);
        for (t, qid) in [
            ("", 0),
            ("NoSuchTopic", 0),
            (topic, -1),
            (topic, i32::MAX),
            (topic, i32::MIN),
        ] {
            let name = format!("offsets of {t:?}/{qid}");
            let (lo, hi) = (
                store.min_queue_offset(t, qid),
                store.max_queue_offset(t, qid),
            );
            expect(&name, (lo, hi) == (0, 0), format!("{lo}, {hi}"));
            let by_time = catch(store.queue_offset_by_time(t, qid, 0)).await;
            expect(
                &format!("{name} by time"),
                matches!(by_time, Ok(Ok(0))),
                format!("{by_time:?}"),
            );
            let early = catch(store.earliest_message_time(t, qid)).await;
            expect(
                &format!("{name} earliest"),
                matches!(early, Ok(Ok(-1))),
                format!("{early:?}"),
            );
        }
        // Times before the first and after the last message, and the extremes.
        for (ts, want) in [(i64::MIN, 0), (-1, 0), (0, 0), (i64::MAX, max)] {
            let r = catch(store.queue_offset_by_time(topic, q, ts)).await;
            expect(
                &format!("offset by time {ts}"),
                matches!(r, Ok(Ok(x)) if x == want),
                format!("{r:?}, want {want}"),
            );
        }
        let long_key = "k".repeat(coremq::index::MAX_KEY_LEN + 1);
        for (name, t, k, begin, end) in [
            ("empty topic", "", "k", 0, i64::MAX),
            ("empty key", topic, "", 0, i64::MAX),
            ("begin after end", topic, "k", 10, 5),
            (
                "key longer than any record can carry",
                topic,
                long_key.as_str(),
                0,
                i64::MAX,
            ),
        ] {
            let r = catch(store.query_by_key(t, k, 10, begin, end)).await;
            expect(
                &format!("query_by_key {name}"),
                matches!(r, Ok(Err(coremq::Error::BadRequest(_)))),
                format!("{r:?}"),
            );
        }
        for (name, t, k, max_hits) in [
            ("max 0", topic, "key-0", 0),
            ("unknown key", topic, "no-such-key", 10),
            ("unknown topic", "NoSuchTopic", "key-0", 10),
        ] {
            let r = catch(store.query_by_key(t, k, max_hits, 0, i64::MAX)).await;
            expect(
                &format!("query_by_key {name}"),
                matches!(&r, Ok(Ok(v)) if v.is_empty()),
                format!("{r:?}"),
            );
        }
        if let Err(e) = still_serves(&store, &mut kept, &mut n).await {
            failures.push(format!("after the table: {e}"));
        }
        if let Err(e) = check_kept(&store, &kept).await {
            failures.push(format!("after the table: {e}"));
        }
        // After shutdown, a clone refuses writes and flushes with clear answers.
        let clone = store.clone();
        store.shutdown().await.unwrap();
        let r = clone.put(good(999)).await;
        if r.status != ServiceNotAvailable {
            failures.push(format!("put after shutdown: {:?}", r.status));
        }
        if !matches!(clone.checkpoint().await, Err(coremq::Error::ShutDown)) {
            failures.push("checkpoint after shutdown is not ShutDown".into());
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    });
}
