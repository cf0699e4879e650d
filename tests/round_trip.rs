//! Put -> get -> clean restart -> get, through several segment rolls.
mod common;
use common::*;
use coremq::{FlushMode, GetStatus, PutStatus, Store, StoreConfig};

fn round_trip(mode: FlushMode) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    run(move || async move {
        let mut cfg = StoreConfig::small_for_tests(&root);
        cfg.flush_mode = mode;
        let store = Store::open(cfg.clone()).await.unwrap();
        let topics = ["TopicA", "TopicB"];
        let mut expected_log = 0u64;
        for i in 0..1500u64 {
            for t in topics {
                let q = (i % 3) as i32;
                let r = store.put(msg(t, q, i)).await;
                assert_eq!(r.status, PutStatus::PutOk);
                assert_eq!(r.queue_offset, i / 3);
                assert!(r.log_offset >= expected_log);
                expected_log = r.log_offset + r.wrote_bytes as u64;
            }
        }
        // ~3 MB of records over 1 MiB segments: at least two rolls.
        assert!(store.max_log_offset() > 2 << 20, "log too small to roll");
        store.wait_dispatched().await;
        let check = |store: Store| async move {
            for t in topics {
                for q in 0..3 {
                    let msgs = read_all(&store, t, q).await;
                    assert_eq!(msgs.len(), 500, "{t}/{q}");
                    for (n, m) in msgs.iter().enumerate() {
                        let i = n as u64 * 3 + q as u64;
                        assert_eq!(m.queue_offset, n as u64);
                        assert_eq!(&m.body[..], &body(t, q, i)[..]);
                        assert_eq!(m.property("TAGS"), Some(format!("tag{}", i % 3).as_str()));
                        let by_id = store
                            .look_by_msg_id(&m.msg_id.unwrap().to_string())
                            .await
                            .unwrap()
                            .unwrap();
                        assert_eq!(by_id.body, m.body);
                    }
                }
            }
            store
        };
        let store = check(store).await;
        store.shutdown().await.unwrap();
        assert!(!root.join("abort").exists());
        let seg_count = std::fs::read_dir(root.join("commitlog")).unwrap().count();
        assert!(seg_count >= 3, "expected several segments, got {seg_count}");

        let store = Store::open(cfg.clone()).await.unwrap();
        assert!(store.report.clean_shutdown);
        assert_eq!(store.report.entries_rebuilt, 0);
        let store = check(store).await;
        // Offsets continue after restart.
        let r = store.put(msg("TopicA", 0, 1500)).await;
        assert_eq!(r.status, PutStatus::PutOk);
        assert_eq!(r.queue_offset, 500);
        store.wait_dispatched().await;
        let g = store.get("TopicA", 0, 500, 10, 1 << 20).await.unwrap();
        assert_eq!(g.status, GetStatus::Found);
        assert_eq!(g.records.len(), 1);
        store.shutdown().await.unwrap();
    });
}

#[test]
fn round_trip_async_flush() {
    round_trip(FlushMode::Async);
}

#[test]
fn round_trip_sync_flush() {
    round_trip(FlushMode::Sync);
}

/// A sync put that is not durable within `sync_flush_timeout` reports
/// `FlushDiskTimeout`, never `PutOk`, and the message is still stored.
#[test]
fn sync_flush_timeout_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    run(move || async move {
        let mut cfg = StoreConfig::small_for_tests(&root);
        cfg.flush_mode = FlushMode::Sync;
        cfg.sync_flush_timeout = std::time::Duration::ZERO;
        let store = Store::open(cfg).await.unwrap();
        let mut timeouts = 0;
        for i in 0..20 {
            let r = store.put(msg("T", 0, i)).await;
            assert!(r.status.is_stored(), "{:?}", r.status);
            timeouts += (r.status == PutStatus::FlushDiskTimeout) as u32;
        }
        assert!(timeouts > 0, "a zero timeout cannot be met by an fdatasync");
        // WAIT=false puts do not wait at all.
        let r = store
            .put(msg("T", 0, 20).with_property("WAIT", "false"))
            .await;
        assert_eq!(r.status, PutStatus::PutOk);
        store.wait_dispatched().await;
        assert_eq!(read_all(&store, "T", 0).await.len(), 21);
        store.shutdown().await.unwrap();
    });
}

/// Puts wait while dispatch is more than `max_dispatch_lag_bytes` behind the log, so
/// the lag consumers and key queries see stays bounded however fast a producer runs.
#[test]
fn dispatch_lag_is_bounded_by_backpressure() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    run(move || async move {
        let mut cfg = StoreConfig::small_for_tests(&root);
        cfg.flush_mode = FlushMode::Async;
        cfg.max_dispatch_lag_bytes = 64 << 10;
        let store = Store::open(cfg.clone()).await.unwrap();
        let mut worst = 0;
        for i in 0..3000u64 {
            let r = store.put(msg("Lag", (i % 4) as i32, i)).await;
            assert_eq!(r.status, PutStatus::PutOk);
            let lag = store.max_log_offset() - store.dispatched_log_offset();
            worst = worst.max(lag);
            // The put's record, and the blank that may end a segment before it.
            assert!(
                lag <= cfg.max_dispatch_lag_bytes + 2 * r.wrote_bytes as u64 + 64,
                "put {i}: dispatch {lag} bytes behind"
            );
        }
        assert!(
            worst > cfg.max_dispatch_lag_bytes / 2,
            "dispatch lagged at most {worst}: the bound was not exercised"
        );
        store.wait_dispatched().await;
        for q in 0..4 {
            assert_eq!(read_all(&store, "Lag", q).await.len(), 750);
        }
        store.shutdown().await.unwrap();
    });
}

/// Write windows are recycled without being zeroed (that memset was 5% of the CPU of
/// 1 KiB puts), so the zeros a log file must hold come from elsewhere: the padding of
/// a partial last page (zeroed in the commit's copy) and the tail of a segment after
/// its blank record (zeroed by `append_blank`). Old window bytes must never reach the
/// disk there. (The async commit copies only the data into a fresh DMA buffer, so its
/// padding guard is against reused allocator memory; the sync round copies into a
/// reused buffer, which the second test catches.)
#[test]
fn recycled_windows_leave_only_zeros_past_the_data() {
    recycled_windows_leave_only_zeros(FlushMode::Async);
}

/// The same through sync-flush rounds, which copy the windows themselves
/// (`CommitLog::sync_round`).
#[test]
fn recycled_windows_leave_only_zeros_past_the_data_in_sync_rounds() {
    recycled_windows_leave_only_zeros(FlushMode::Sync);
}

fn recycled_windows_leave_only_zeros(mode: FlushMode) {
    use coremq::format::record::{BLANK_MAGIC, peek_header};
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    run(move || async move {
        let mut cfg = StoreConfig::small_for_tests(&root);
        cfg.flush_mode = mode;
        let pool = (cfg.write_buffer_bytes * cfg.write_buffer_count) as u64;
        let store = Store::open(cfg.clone()).await.unwrap();
        // Bodies of 0xAB, sizes varying so records end anywhere in a page.
        let mut i = 0u64;
        while store.max_log_offset() < 4 * pool + 3 * cfg.commit_log_segment_bytes {
            let len = 300 + (i as usize * 7919) % 6000;
            let m = coremq::Message::new("Zeros", (i % 4) as i32, vec![0xAB; len]);
            assert_eq!(store.put(m).await.status, PutStatus::PutOk);
            i += 1;
        }
        // One small record so the log ends mid-page, then everything to disk.
        let m = coremq::Message::new("Zeros", 0, vec![0xAB; 100]);
        assert_eq!(store.put(m).await.status, PutStatus::PutOk);
        let end = store.flush().await.unwrap();
        let seg = cfg.commit_log_segment_bytes;
        let mut segments: Vec<_> = std::fs::read_dir(root.join("commitlog"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        segments.sort();
        assert!(segments.len() >= 4, "{segments:?}");
        for path in &segments {
            let start: u64 = path.file_name().unwrap().to_str().unwrap().parse().unwrap();
            let bytes = std::fs::read(path).unwrap();
            if start + seg <= end {
                // A full segment: records, then a blank record, then zeros to its end.
                let mut at = 0usize;
                loop {
                    let (size, magic) = peek_header(&bytes[at..]).unwrap();
                    if magic == BLANK_MAGIC {
                        assert_eq!(at + size as usize, seg as usize, "{}", path.display());
                        let tail = &bytes[at + 8..seg as usize];
                        assert!(
                            tail.iter().all(|&b| b == 0),
                            "{}: non-zero bytes after the blank record at {at}",
                            path.display()
                        );
                        break;
                    }
                    at += size as usize;
                }
            } else if start <= end {
                // The last segment: the page holding the end is zero past it.
                let off = (end - start) as usize;
                let page_end = off.div_ceil(4096) * 4096;
                assert!(bytes.len() >= page_end);
                assert!(
                    bytes[off..page_end].iter().all(|&b| b == 0),
                    "{}: non-zero padding after the log end {end}",
                    path.display()
                );
            }
            // (A segment past the end was created ahead by the writer: nothing in it.)
        }
        store.shutdown().await.unwrap();
    });
}

/// Many sync puts in flight at once, of sizes that end anywhere in a page and cross
/// write windows and segments: the group-commit thread writes straight from the
/// windows while puts append behind it, so every acknowledged record must read back
/// byte for byte, in its queue position, before and after a restart.
#[test]
fn concurrent_sync_puts_read_back_across_windows_and_segments() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    run(move || async move {
        let mut cfg = StoreConfig::small_for_tests(&root);
        cfg.flush_mode = FlushMode::Sync;
        let store = Store::open(cfg.clone()).await.unwrap();
        let body_of = |task: u64, i: u64| {
            let len = 50 + ((task * 131 + i * 7919) % 20_000) as usize;
            let mut b = vec![0u8; len];
            for (k, x) in b.iter_mut().enumerate() {
                *x = (task as usize * 31 + i as usize * 17 + k) as u8;
            }
            b
        };
        let tasks: Vec<_> = (0..48u64)
            .map(|task| {
                let store = store.clone();
                glommio::spawn_local(async move {
                    let mut placed = Vec::new();
                    for i in 0..40u64 {
                        let m = coremq::Message::new("Many", (task % 6) as i32, body_of(task, i));
                        let r = store.put(m).await;
                        assert_eq!(r.status, PutStatus::PutOk, "task {task} put {i}");
                        placed.push((task, i, r.queue_offset));
                    }
                    placed
                })
            })
            .collect();
        let mut placed = Vec::new();
        for t in tasks {
            placed.extend(t.await);
        }
        assert!(
            store.max_log_offset() > 3 * cfg.commit_log_segment_bytes,
            "the puts should cross several segments"
        );
        let check = |store: Store, placed: Vec<(u64, u64, u64)>| async move {
            store.wait_dispatched().await;
            for &(task, i, qo) in &placed {
                let g = store
                    .get("Many", (task % 6) as i32, qo, 1, 1 << 20)
                    .await
                    .unwrap();
                assert_eq!(g.status, GetStatus::Found, "task {task} put {i} at {qo}");
                let m = coremq::StoredMessage::decode(&g.records[0]).unwrap();
                assert_eq!(m.queue_offset, qo);
                assert_eq!(&m.body[..], &body_of(task, i)[..], "task {task} put {i}");
            }
            (store, placed)
        };
        let (store, placed) = check(store, placed).await;
        store.shutdown().await.unwrap();
        let store = Store::open(cfg.clone()).await.unwrap();
        assert!(store.report.clean_shutdown);
        let (store, _) = check(store, placed).await;
        store.shutdown().await.unwrap();
    });
}
