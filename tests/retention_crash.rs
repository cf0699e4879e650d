//! Retention and power loss (issue 19), on the simulated disk: a power loss at every
//! sync point of a retention pass (a topic deleted, expired segments, queue and index
//! files deleted, the deleted-topics file written and forgotten), and at a third of
//! them again during the recovery that follows. Every reopen must succeed, and:
//! * every acknowledged message is either present and intact (by queue, id and key)
//!   or lies below the log's minimum (deleted by retention), never in between: what
//!   is present is exactly the acknowledged messages at or past the minimum;
//! * a topic whose deletion was made durable never comes back (its queues, keys);
//!   one whose deletion was not is whole;
//! * the recovered store takes puts, shuts down cleanly and reopens.
//!
//! `COREMQ_SIM_K=<k>` replays one crash point.

mod common;

use coremq::io::{Disk, SimDisk};
use coremq::{FlushMode, GetStatus, Message, PutStatus, Store, StoreConfig, StoredMessage};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

fn cfg(disk: &Arc<SimDisk>, spares: usize) -> StoreConfig {
    let mut c = StoreConfig::small_for_tests(Path::new("/sim/ret"));
    c.commit_log_spare_segments = spares;
    c.disk = Disk::Sim(disk.clone());
    c.flush_mode = FlushMode::Sync;
    c.flush_mark_interval = Duration::ZERO;
    c.consume_queue_flush_interval = Duration::from_secs(3600);
    c.index_max_entries = 500;
    c.retention.file_reserved_time = Duration::ZERO;
    c.retention.delete_interval = Duration::ZERO;
    c.retention.clean_interval = Duration::from_secs(3600);
    c.retention.delete_file_batch_max = 3;
    c
}

/// A message put: its topic, queue, number, commit-log offset and id (the last two
/// only when stored), and whether the put was acknowledged.
#[derive(Debug, Clone)]
struct Sent {
    topic: &'static str,
    queue: i32,
    n: u64,
    offset: u64,
    id: String,
    acked: bool,
}

fn message(topic: &str, queue: i32, n: u64) -> Message {
    let mut body = vec![(n % 251) as u8; 1500 + (n as usize * 37) % 700];
    body[..8].copy_from_slice(&n.to_be_bytes());
    Message::new(topic, queue, body).with_keys(format!("k{n}"))
}

/// Puts `count` messages from `from`, 40 at a time (one sync round each group);
/// keeps the acknowledged ones.
async fn put_some(store: &Store, from: u64, count: u64, sent: &mut Vec<Sent>) {
    let mut n = from;
    while n < from + count {
        let group: Vec<(&'static str, i32, u64)> = (n..(n + 40).min(from + count))
            .map(|i| match i % 5 {
                0 => ("B", 0, i),
                k => ("A", (k % 2) as i32, i),
            })
            .collect();
        n += group.len() as u64;
        // Issued together: group commit takes them in one round.
        let puts: Vec<_> = group
            .iter()
            .map(|(t, q, i)| store.put(message(t, *q, *i)))
            .collect();
        let results = join_all(puts).await;
        // A put whose round the power loss broke answers FlushDiskTimeout: its
        // record may or may not be there after recovery.
        for ((t, q, i), r) in group.into_iter().zip(results) {
            sent.push(Sent {
                topic: t,
                queue: q,
                n: i,
                offset: r.log_offset,
                id: r.msg_ids.first().map(|m| m.to_string()).unwrap_or_default(),
                acked: r.status == PutStatus::PutOk,
            });
        }
    }
}

async fn join_all<F: std::future::Future>(futs: Vec<F>) -> Vec<F::Output> {
    let mut pinned: Vec<_> = futs.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = (0..pinned.len()).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut done = true;
        for (i, f) in pinned.iter_mut().enumerate() {
            if out[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => out[i] = Some(v),
                    std::task::Poll::Pending => done = false,
                }
            }
        }
        if done {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    out.into_iter().map(|o| o.unwrap()).collect()
}

/// What the workload did, and the store when it got to the end.
struct Run {
    sent: Vec<Sent>,
    /// Sync points when the retention part began (the workload before it is the same
    /// every run).
    pass_from: u64,
    store: Option<Store>,
}

/// ~5 segments of messages, made durable and checkpointed; then the retention part:
/// topic B deleted, a pass deleting up to 3 expired segments with their queue and
/// index files, a second pass (more segments, and B forgotten once its records are
/// gone), and a few puts after.
async fn workload(disk: &Arc<SimDisk>, spares: usize) -> Run {
    let mut run = Run {
        sent: Vec::new(),
        pass_from: u64::MAX,
        store: None,
    };
    let Ok(store) = Store::open(cfg(disk, spares)).await else {
        return run;
    };
    put_some(&store, 0, 2600, &mut run.sent).await;
    store.wait_dispatched().await;
    if store.checkpoint().await.is_err() {
        return run;
    }
    // Everything is older than the zero reserved time once the clock moves on.
    std::thread::sleep(Duration::from_millis(3));
    run.pass_from = disk.sync_points();
    let _ = store.delete_topic("B").await;
    let _ = store.delete_expired_files().await;
    let after = if spares > 0 {
        // Segment recycling: the spares are zero-filled, then the puts take them
        // (renamed into place) and a new file.
        for _ in 0..1000 {
            let s = store.stats();
            if s.spare_segments_pending == 0 || disk.crashed() {
                break;
            }
            glommio::timer::sleep(Duration::from_millis(1)).await;
        }
        1300
    } else {
        80
    };
    put_some(&store, 2600, after, &mut run.sent).await;
    store.wait_dispatched().await;
    let _ = store.checkpoint().await;
    let _ = store.delete_expired_files().await;
    run.store = Some(store);
    run
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

/// The checks of the module docs on a reopened store.
async fn verify(store: &Store, sent: &[Sent], ctx: &str) {
    let min = store.min_log_offset();
    // B's first generation (sent before its deletion) is hidden once the deletion
    // is durable; B sent after starts new queues.
    let b_deleted = store.deleted_topics().iter().any(|(t, _)| t == "B")
        || store.queues().iter().all(|(t, _)| t != "B");
    let hidden = |s: &Sent| s.topic == "B" && s.n < 2600 && b_deleted;
    let mut by_queue: BTreeMap<(&str, i32), Vec<&Sent>> = BTreeMap::new();
    for s in sent {
        by_queue.entry((s.topic, s.queue)).or_default().push(s);
    }
    for ((topic, q), all) in &by_queue {
        let got = read_queue(store, topic, *q).await;
        let have: Vec<u64> = got
            .iter()
            .map(|m| u64::from_be_bytes(m.body[..8].try_into().unwrap()))
            .collect();
        // Every acknowledged message at or past the minimum, in order, and nothing
        // else but messages whose put was not acknowledged.
        let mut rest = all
            .iter()
            .filter(|s| !hidden(s) && (s.offset >= min || !s.acked));
        for n in &have {
            loop {
                let s = rest.next().unwrap_or_else(|| {
                    panic!(
                        "{ctx}: {topic}/{q}: message {n} read but never sent there (log min {min})"
                    )
                });
                if s.n == *n {
                    break;
                }
                assert!(
                    !(s.acked && s.offset >= min),
                    "{ctx}: {topic}/{q}: acknowledged message {} missing (log min {min})",
                    s.n
                );
            }
        }
        if let Some(s) = rest.find(|s| s.acked && s.offset >= min) {
            panic!(
                "{ctx}: {topic}/{q}: acknowledged message {} missing at the end",
                s.n
            );
        }
        for (m, n) in got.iter().zip(&have) {
            assert_eq!(m.body.len(), message(topic, *q, *n).body.len(), "{ctx}");
        }
    }
    for s in sent.iter().filter(|s| s.acked).step_by(7) {
        let found = store.look_by_msg_id(&s.id).await.unwrap();
        assert_eq!(found.is_some(), s.offset >= min, "{ctx}: id of {s:?}");
        let hits = store
            .query_by_key(s.topic, &format!("k{}", s.n), 4, 0, i64::MAX)
            .await
            .unwrap();
        let visible = s.offset >= min && !hidden(s);
        assert_eq!(hits.len(), visible as usize, "{ctx}: key of {s:?}");
    }
}

/// The sweep of the module docs, with `spares` spare segments kept.
async fn sweep(spares: usize) {
    let reference = SimDisk::new();
    let run = workload(&reference, spares).await;
    let store = run.store.expect("reference run");
    verify(&store, &run.sent, "reference").await;
    if spares > 0 {
        let s = store.stats();
        assert!(
            s.segments_reused >= 1,
            "the reference run reused spare segments: {s:?}"
        );
    }
    assert!(
        store.min_log_offset() >= 3 << 20,
        "the passes deleted segments"
    );
    assert!(store.deleted_topics().is_empty() || !store.queues().iter().any(|(t, _)| t == "B"));
    store.shutdown().await.unwrap();
    let (from, to) = (run.pass_from, reference.sync_points());
    assert!(
        to > from + 10,
        "the retention part has sync points: {from}..{to}"
    );
    let only: Option<u64> = std::env::var("COREMQ_SIM_K")
        .ok()
        .map(|v| v.parse().unwrap());
    let mut crashed_in_pass = 0;
    for k in from + 1..=to {
        if only.is_some_and(|o| o != k) {
            continue;
        }
        let ctx = format!("crash at sync point {k} ({from}..{to})");
        let disk = SimDisk::new();
        disk.crash_at_sync(k);
        let run = workload(&disk, spares).await;
        if let Some(s) = run.store.filter(|_| !disk.crashed()) {
            let _ = s.shutdown().await;
        }
        if !disk.crashed() {
            disk.crash_now();
        } else if disk.sync_points() > run.pass_from {
            crashed_in_pass += 1;
        }
        let mut image = disk.crash_image(k * 7919);
        if k % 3 == 0 {
            image.crash_at_sync(1 + k % 5);
            if let Ok(s) = Store::open(cfg(&image, spares)).await {
                drop(s);
            }
            image = image.crash_image(k * 104_729);
        }
        let store = Store::open(cfg(&image, spares))
            .await
            .unwrap_or_else(|e| panic!("{ctx}: reopen failed: {e}"));
        verify(&store, &run.sent, &ctx).await;
        let r = store.put(message("C", 0, 9999)).await;
        assert_eq!(r.status, PutStatus::PutOk, "{ctx}: put after recovery");
        store.shutdown().await.unwrap();
        let store = Store::open(cfg(&image, spares))
            .await
            .unwrap_or_else(|e| panic!("{ctx}: reopen after a clean shutdown: {e}"));
        verify(&store, &run.sent, &ctx).await;
        store.shutdown().await.unwrap();
    }
    eprintln!(
        "{} crash points, {crashed_in_pass} inside the retention part",
        to - from
    );
    assert!(only.is_some() || crashed_in_pass * 10 >= (to - from) * 8);
}

#[test]
fn power_loss_at_every_sync_point_of_a_retention_pass() {
    common::run(|| sweep(0));
}

/// The same with segment recycling: retired segments renamed into `spare/`, zero-filled,
/// renamed into place as the next segments; a power loss at every step (and a spare
/// left under two names) never loses or revives a record.
#[test]
fn power_loss_at_every_sync_point_with_segment_recycling() {
    common::run(|| sweep(2));
}
