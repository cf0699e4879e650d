//! The sharded store: ownership, routing from outside threads and from shard-local
//! tasks, message ids naming shards, batches across shards, restarts, refusal of a
//! different shard count, and one shard dying while the others serve.
mod common;
use common::body;
use coremq::shard::{SHARD_SHIFT, shard_of};
use coremq::{
    Error, GetStatus, Message, PutStatus, ShardedConfig, ShardedStore, StoreConfig, StoreOps,
    StoredMessage,
};
use futures_lite::future::block_on;

fn config(root: &std::path::Path, shards: usize) -> ShardedConfig {
    let mut cfg = ShardedConfig::new(root);
    cfg.shards = shards;
    cfg.store = StoreConfig::small_for_tests(root);
    cfg
}

const TOPICS: [&str; 3] = ["Orders", "Payments", "Audit"];
const QUEUES: i32 = 8;

fn message(t: &str, q: i32, i: u64) -> Message {
    Message::new(t, q, body(t, q, i))
        .with_tags("x")
        .with_keys(format!("k{i}"))
}

/// Reads a whole queue through the handle.
fn read_queue(h: &coremq::Handle, t: &str, q: i32) -> Vec<StoredMessage> {
    let mut out = Vec::new();
    let mut off = 0;
    loop {
        let r = block_on(h.get(t, q, off, 32, 1 << 20)).unwrap();
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
            | GetStatus::NoMatchedLogicQueue => {
                return out;
            }
            s => panic!("{s:?}"),
        }
    }
}

#[test]
fn ownership_is_stable_and_spreads() {
    // Pinned values: changing the hash would move queues away from their data.
    assert_eq!(shard_of("Orders", 0, 2), shard_of("Orders", 0, 2));
    let spread: std::collections::HashSet<usize> =
        (0..QUEUES).map(|q| shard_of("Orders", q, 4)).collect();
    assert!(
        spread.len() >= 3,
        "8 queues should land on most of 4 shards: {spread:?}"
    );
    // (crc32(topic) + queue) % shards: a topic's queues round robin over the shards.
    let t = crc32fast::hash(b"Orders") as usize;
    assert_eq!(shard_of("Orders", 3, 7), (t + 3) % 7);
    let on_two: Vec<usize> = (0..4).map(|q| shard_of("Orders", q, 2)).collect();
    assert_eq!(on_two.iter().filter(|s| **s == 0).count(), 2, "{on_two:?}");
}

#[test]
fn puts_from_threads_and_shard_tasks_then_restart() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let store = ShardedStore::open(config(root, 2)).unwrap();
    let h = store.handle();
    // Producers on plain threads, one per topic.
    let threads: Vec<_> = TOPICS
        .iter()
        .map(|t| {
            let h = h.clone();
            let t = t.to_string();
            std::thread::spawn(move || {
                for i in 0..120u64 {
                    let q = (i % QUEUES as u64) as i32;
                    let r = block_on(h.put(message(&t, q, i)));
                    assert_eq!(r.status, PutStatus::PutOk);
                    assert_eq!(r.queue_offset, i / QUEUES as u64);
                    let shard = (r.log_offset >> SHARD_SHIFT) as usize;
                    assert_eq!(shard, h.shard_of(&t, q), "offset names the owning shard");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // Shard-local tasks put into every queue: local ones with no hop, others routed.
    for shard in 0..2 {
        let (local, routed) = block_on(h.run_on(shard, move |ctx| async move {
            let (mut local, mut routed) = (0, 0);
            for q in 0..QUEUES {
                let owned = ctx.owns("Local", q);
                let r = ctx.put(message("Local", q, shard as u64)).await;
                assert_eq!(r.status, PutStatus::PutOk);
                if owned { local += 1 } else { routed += 1 }
            }
            (local, routed)
        }))
        .unwrap();
        assert_eq!(local + routed, QUEUES);
    }
    block_on(h.wait_dispatched()).unwrap();
    let check = |h: &coremq::Handle| {
        let mut shards_used = std::collections::HashSet::new();
        for t in TOPICS {
            for q in 0..QUEUES {
                let msgs = read_queue(h, t, q);
                assert_eq!(msgs.len(), 15, "{t}/{q}");
                for (n, m) in msgs.iter().enumerate() {
                    let i = n as u64 * QUEUES as u64 + q as u64;
                    assert_eq!(&m.body[..], &body(t, q, i)[..]);
                    let id = m.msg_id.unwrap().to_string();
                    let by_id = block_on(h.look_by_msg_id(&id))
                        .unwrap()
                        .expect("found by id");
                    assert_eq!(by_id.body, m.body);
                    shards_used.insert((m.log_offset >> SHARD_SHIFT) as usize);
                }
            }
        }
        assert_eq!(shards_used.len(), 2, "both shards hold data");
        for q in 0..QUEUES {
            assert_eq!(read_queue(h, "Local", q).len(), 2);
        }
    };
    check(&h);
    store.shutdown().unwrap();
    assert!(root.join("shard-0/commitlog").is_dir() && root.join("shard-1/commitlog").is_dir());
    assert!(!root.join("shard-0/abort").exists());

    // Same count: everything is back. Another count: refused, data untouched.
    let err = ShardedStore::open(config(root, 3)).err().expect("refused");
    assert!(
        matches!(err, Error::Config(ref m) if m.contains("2 shards")),
        "{err}"
    );
    let store = ShardedStore::open(config(root, 2)).unwrap();
    check(&store.handle());
    store.shutdown().unwrap();
}

#[test]
fn batch_across_shards_keeps_input_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = ShardedStore::open(config(dir.path(), 2)).unwrap();
    let h = store.handle();
    let msgs: Vec<Message> = (0..40u64)
        .map(|i| message("Mixed", (i % 5) as i32, i))
        .collect();
    let results = block_on(h.put_batch(msgs));
    assert_eq!(results.len(), 40);
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r.status, PutStatus::PutOk);
        assert_eq!(r.queue_offset, i as u64 / 5, "message {i}");
        assert_eq!(r.msg_ids.len(), 1);
        assert_eq!(r.log_offset, r.msg_ids[0].offset);
    }
    block_on(h.wait_dispatched()).unwrap();
    for (i, r) in results.iter().enumerate() {
        let m = block_on(h.look_by_offset(r.log_offset)).unwrap().unwrap();
        assert_eq!(&m.body[..], &body("Mixed", (i % 5) as i32, i as u64)[..]);
    }
    store.shutdown().unwrap();
}

#[test]
fn bad_ids_and_requests_after_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let store = ShardedStore::open(config(dir.path(), 2)).unwrap();
    let h = store.handle();
    for bad in ["", "xyz", &"G".repeat(32), &"0".repeat(31)] {
        assert!(
            matches!(block_on(h.look_by_msg_id(bad)), Err(Error::BadRequest(_))),
            "{bad:?}"
        );
    }
    // A well-formed id naming shard 5 of a 2-shard store.
    let id = coremq::format::msg_id::MessageId {
        store_host: "127.0.0.1:10911".parse().unwrap(),
        offset: 5 << SHARD_SHIFT,
    };
    let err = block_on(h.look_by_msg_id(&id.to_string())).unwrap_err();
    assert!(
        matches!(err, Error::BadRequest(ref m) if m.contains("shard 5")),
        "{err}"
    );
    // A valid shard but no record there.
    let id = coremq::format::msg_id::MessageId {
        offset: 1 << SHARD_SHIFT,
        ..id
    };
    assert!(
        block_on(h.look_by_msg_id(&id.to_string()))
            .unwrap()
            .is_none()
    );
    store.shutdown().unwrap();
    assert_eq!(
        block_on(h.put(message("T", 0, 0))).status,
        PutStatus::ServiceNotAvailable
    );
    assert!(matches!(
        block_on(h.get("T", 0, 0, 1, 1 << 20)),
        Err(Error::ShutDown)
    ));
}

/// `put_and_return` stores on the owning shard, from outside threads and from the
/// other shard, and hands the very message back.
#[test]
fn put_and_return_stores_and_hands_the_message_back() {
    let dir = tempfile::tempdir().unwrap();
    let store = ShardedStore::open(config(dir.path(), 2)).unwrap();
    let h = store.handle();
    for q in 0..4 {
        let sent = message("Back", q, q as u64);
        let (r, back) = block_on(h.put_and_return(sent.clone()));
        assert_eq!(r.status, PutStatus::PutOk);
        let back = back.expect("the message comes back");
        assert_eq!((back.topic.as_str(), back.queue_id), ("Back", q));
        assert_eq!(back.body, sent.body);
        assert_eq!(back.properties, sent.properties);
    }
    // From shard 0's own task, to queues of both shards (one routed).
    let h2 = h.clone();
    let routed = block_on(h.run_on(0, move |_ctx| async move {
        let mut out = Vec::new();
        for q in 4..8 {
            let (r, back) = h2.put_and_return(message("Back", q, q as u64)).await;
            out.push((r.status, back.map(|m| m.queue_id)));
        }
        out
    }))
    .unwrap();
    for (i, (status, q)) in routed.into_iter().enumerate() {
        assert_eq!((status, q), (PutStatus::PutOk, Some(4 + i as i32)));
    }
    block_on(h.wait_dispatched()).unwrap();
    for q in 0..8 {
        let got = read_queue(&h, "Back", q);
        assert_eq!(got.len(), 1, "queue {q}");
        assert_eq!(&got[0].body[..], &body("Back", q, q as u64)[..]);
    }
    store.shutdown().unwrap();
}

#[test]
fn a_dead_shard_does_not_stop_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let store = ShardedStore::open(config(dir.path(), 2)).unwrap();
    let h = store.handle();
    let (dead_q, live_q) = {
        let d = (0..QUEUES).find(|q| h.shard_of("T", *q) == 1).unwrap();
        let l = (0..QUEUES).find(|q| h.shard_of("T", *q) == 0).unwrap();
        (d, l)
    };
    assert_eq!(
        block_on(h.put(message("T", dead_q, 0))).status,
        PutStatus::PutOk
    );
    // Kill shard 1's thread: a task that panics takes its executor down.
    let _ = block_on(h.run_on(1, |_ctx| async { panic!("simulated shard crash") }));
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(
        block_on(h.put(message("T", dead_q, 1))).status,
        PutStatus::ServiceNotAvailable
    );
    let (r, back) = block_on(h.put_and_return(message("T", dead_q, 1)));
    assert_eq!(r.status, PutStatus::ServiceNotAvailable);
    assert!(back.is_none(), "no message comes back from a dead shard");
    let err = block_on(h.get("T", dead_q, 0, 1, 1 << 20)).unwrap_err();
    assert!(
        matches!(err, Error::ShardUnavailable { shard: 1, .. }),
        "{err}"
    );
    for i in 0..10 {
        assert_eq!(
            block_on(h.put(message("T", live_q, i))).status,
            PutStatus::PutOk
        );
    }
    // wait_dispatched() would report the dead shard; wait for shard 0 alone.
    block_on(h.run_on(0, |ctx| async move { ctx.store.wait_dispatched().await })).unwrap();
    assert_eq!(read_queue(&h, "T", live_q).len(), 10);
    assert!(store.shutdown().is_err(), "shutdown reports the dead shard");
}

#[test]
fn an_io_error_stops_only_that_shard() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    // Shard 1 lives on a 6 MiB filesystem: its writes fail with ENOSPC.
    let Some(_mount) = common::tiny_fs(&dir.path().join("img"), &root.join("shard-1"), 6) else {
        eprintln!("SKIPPED: cannot mount a loop filesystem here (needs root)");
        return;
    };
    let mut cfg = config(&root, 2);
    cfg.store.flush_mode = coremq::FlushMode::Sync;
    // Watermarks off: this test is about a real write error (tests/disk_full.rs checks
    // that the watermarks refuse puts before one happens).
    cfg.store.disk_space_check = false;
    let store = ShardedStore::open(cfg).unwrap();
    let h = store.handle();
    let q1 = (0..QUEUES).find(|q| h.shard_of("T", *q) == 1).unwrap();
    let q0 = (0..QUEUES).find(|q| h.shard_of("T", *q) == 0).unwrap();
    let big = vec![7u8; 100 << 10];
    let mut failed_at = None;
    for i in 0..200 {
        let r = block_on(h.put(Message::new("T", q1, big.clone())));
        if r.status != PutStatus::PutOk {
            // Appended, then its write failed: stored, durability unknown. (A put
            // refused before it was appended: nothing stored.)
            assert!(
                matches!(
                    r.status,
                    PutStatus::FlushDiskTimeout | PutStatus::ServiceNotAvailable
                ),
                "{r:?}"
            );
            failed_at = Some(i);
            break;
        }
    }
    assert!(failed_at.is_some(), "6 MiB cannot hold 20 MiB");
    let status = block_on(h.shard_status(1)).unwrap();
    let why = status.failure.expect("shard 1 reports its failure");
    assert!(
        why.contains("No space left") || why.contains("os error 28"),
        "{why}"
    );
    // Fail-stop: later puts on shard 1 are refused at once; shard 0 serves.
    assert_eq!(
        block_on(h.put(Message::new("T", q1, "x"))).status,
        PutStatus::ServiceNotAvailable
    );
    for i in 0..20 {
        assert_eq!(
            block_on(h.put(message("T", q0, i))).status,
            PutStatus::PutOk
        );
    }
    assert!(block_on(h.shard_status(0)).unwrap().failure.is_none());
    assert!(
        store.shutdown().is_err(),
        "shutdown reports shard 1's failure"
    );
}

/// Placement: `cpus` pins shard `i` to `cpus[i]` (here in reverse order, so the
/// default `i`-th CPU would fail the check); a CPU the process may not use is a
/// config error at open.
#[test]
fn shards_run_on_the_cpus_named() {
    let allowed: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
        .filter(|&c| {
            // SAFETY: sched_getaffinity writes one cpu_set_t into the zeroed set.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0
                    && libc::CPU_ISSET(c, &set)
            }
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), 2);
    cfg.cpus = Some(vec![*allowed.last().unwrap(), allowed[0]]);
    let want = cfg.cpus.clone().unwrap();
    let store = ShardedStore::open(cfg.clone()).unwrap();
    let h = store.handle();
    for (shard, cpu) in want.iter().enumerate() {
        // SAFETY: no arguments.
        let on = block_on(h.run_on(shard, |_| async { unsafe { libc::sched_getcpu() } }));
        assert_eq!(on.unwrap(), *cpu as i32, "shard {shard}");
    }
    store.shutdown().unwrap();

    let mut bad = cfg;
    bad.cpus = Some(vec![allowed[0], libc::CPU_SETSIZE as usize - 1]);
    match ShardedStore::open(bad) {
        Err(Error::Config(msg)) => assert!(msg.contains("cpus"), "{msg}"),
        other => panic!("a CPU outside the affinity mask opened: {:?}", other.err()),
    }
}

/// coremq's `block_on` (the caller spins briefly for a reply expected soon) with and
/// without a reply spin, and shard-to-shard requests with the shards' awake window:
/// every put answered once, in order, readable afterwards.
#[test]
fn puts_with_and_without_spinning_on_either_side() {
    for (spin_us, window_us) in [(0, 0), (50, 50), (2_000, 2_000)] {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(dir.path(), 2);
        cfg.reply_spin = std::time::Duration::from_micros(spin_us);
        cfg.awake_window = std::time::Duration::from_micros(window_us);
        let store = ShardedStore::open(cfg).unwrap();
        let h = store.handle();
        for i in 0..300 {
            let r = coremq::block_on(h.put(message("Orders", (i % QUEUES as u64) as i32, i)));
            assert_eq!(r.status, PutStatus::PutOk);
        }
        // From shard 0 to every queue: half of them owned by shard 1.
        let n = block_on(h.run_on(0, |ctx| async move {
            let mut n = 0;
            for i in 300..600u64 {
                let r = ctx
                    .put(message("Orders", (i % QUEUES as u64) as i32, i))
                    .await;
                n += usize::from(r.status == PutStatus::PutOk);
            }
            n
        }))
        .unwrap();
        assert_eq!(n, 300);
        let total: usize = (0..QUEUES).map(|q| read_queue(&h, "Orders", q).len()).sum();
        assert_eq!(total, 600, "spin {spin_us} us, window {window_us} us");
        store.shutdown().unwrap();
    }
}

/// The shard polls each request once itself and lets one that waits go on as a task of
/// its own: a request that waits holds up neither the requests after it (from the same
/// thread and from another) nor its own completion.
#[test]
fn a_waiting_request_does_not_hold_up_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let store = ShardedStore::open(config(dir.path(), 2)).unwrap();
    let h = store.handle();
    let (started_tx, started) = flume::bounded::<()>(1);
    let (release, released) = flume::bounded::<()>(1);
    // Waits on shard 0 until released.
    let waiting = {
        let h = h.clone();
        std::thread::spawn(move || {
            block_on(h.run_on(0, move |_ctx| async move {
                started_tx.send(()).unwrap();
                released.recv_async().await.is_ok()
            }))
        })
    };
    started
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("the waiting request started on shard 0");
    // Meanwhile shard 0 answers puts from two other threads, one after the other.
    let queue = (0..QUEUES)
        .find(|&q| h.shard_of("Orders", q) == 0)
        .expect("a queue on shard 0");
    let (done_tx, done) = flume::unbounded();
    for t in 0..2u64 {
        let (h, done_tx) = (h.clone(), done_tx.clone());
        std::thread::spawn(move || {
            for i in 0..20 {
                let r = block_on(h.put(message("Orders", queue, t * 100 + i)));
                done_tx.send(r.status).unwrap();
            }
        });
    }
    let answered: Vec<PutStatus> = (0..40)
        .map_while(|_| done.recv_timeout(std::time::Duration::from_secs(10)).ok())
        .collect();
    let still_waiting = !waiting.is_finished();
    // Released before any assertion, so a failure does not leave the shard waiting.
    release.send(()).unwrap();
    assert_eq!(answered.len(), 40, "puts held up behind a waiting request");
    assert!(
        answered.iter().all(|s| *s == PutStatus::PutOk),
        "{answered:?}"
    );
    assert!(
        still_waiting,
        "the waiting request ended before it was released"
    );
    // And the waiting request ends once what it waits for comes.
    assert!(waiting.join().unwrap().unwrap());
    store.shutdown().unwrap();
}
