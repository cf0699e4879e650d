//! The CommitLog read cache (`coremq::commit_log::read_cache`): interleaved queues read back
//! byte-identical through it, a tiny cache that must evict, gets racing puts, reads
//! after a reopen, and damaged bytes still refused when they come through the cache.
mod common;
use bytes::Bytes;
use common::*;
use coremq::{Error, GetStatus, PutStatus, Store, StoreConfig, StoredMessage};
use std::path::Path;

const TOPIC: &str = "Interleaved";
const QUEUES: i32 = 16;

/// Small segments and windows (1 MiB, 8 x 64 KiB), so most of the log is only on disk.
fn config(root: &Path, cache_bytes: usize, block: usize) -> StoreConfig {
    StoreConfig {
        read_cache_bytes: cache_bytes,
        read_cache_block_bytes: block,
        read_cache_inflight: 2,
        read_cache_readahead_blocks: 4,
        ..StoreConfig::small_for_tests(root)
    }
}

/// Puts `per_queue` messages to each queue, round robin (each queue's records are
/// every `QUEUES`-th record of the log).
async fn fill(store: &Store, from: u64, per_queue: u64) {
    for i in from..from + per_queue {
        for q in 0..QUEUES {
            let r = store.put(msg(TOPIC, q, i)).await;
            assert_eq!(r.status, PutStatus::PutOk);
            assert_eq!(r.queue_offset, i);
        }
    }
    store.wait_dispatched().await;
}

/// Every queue read from its first offset by its own reader, all at once.
async fn read_all_queues(store: &Store, batch: usize) -> Vec<Vec<Bytes>> {
    let readers: Vec<_> = (0..QUEUES)
        .map(|q| {
            let store = store.clone();
            glommio::spawn_local(async move {
                let mut out = Vec::new();
                let mut off = store.min_queue_offset(TOPIC, q);
                loop {
                    let r = store.get(TOPIC, q, off, batch, 64 << 20).await.unwrap();
                    match r.status {
                        GetStatus::Found => {
                            out.extend(r.records);
                            off = r.next_begin_offset;
                        }
                        GetStatus::OffsetOverflowOne => return out,
                        s => panic!("{TOPIC}/{q} at {off}: {s:?}"),
                    }
                }
            })
        })
        .collect();
    let mut all = Vec::new();
    for r in readers {
        all.push(r.await);
    }
    all
}

fn check_bodies(all: &[Vec<Bytes>], per_queue: u64) {
    assert_eq!(all.len(), QUEUES as usize);
    for (q, records) in all.iter().enumerate() {
        assert_eq!(records.len() as u64, per_queue, "queue {q}");
        for (i, raw) in records.iter().enumerate() {
            let m = StoredMessage::decode(raw).unwrap();
            assert_eq!(m.queue_id, q as i32);
            assert_eq!(m.queue_offset, i as u64);
            assert_eq!(&m.body[..], &body(TOPIC, q as i32, i as u64)[..]);
        }
    }
}

#[test]
fn interleaved_queues_read_back_identical_through_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    run(move || async move {
        let per_queue = 200;
        let store = Store::open(config(&root, 4 << 20, 64 << 10)).await.unwrap();
        fill(&store, 0, per_queue).await;
        let log_bytes = store.max_log_offset() - store.min_log_offset();
        assert!(log_bytes > 4 << 20, "log of {log_bytes} bytes is too small");
        store.shutdown().await.unwrap();

        // Reference: the same log read with the cache off.
        let plain = Store::open(config(&root, 0, 64 << 10)).await.unwrap();
        assert!(plain.read_cache_stats().is_none());
        let expected = read_all_queues(&plain, 64).await;
        plain.shutdown().await.unwrap();
        check_bodies(&expected, per_queue);

        let store = Store::open(config(&root, 4 << 20, 64 << 10)).await.unwrap();
        assert_eq!(
            store.read_cache_stats().unwrap().reads,
            0,
            "a new cache per open"
        );
        let got = read_all_queues(&store, 64).await;
        assert_eq!(got, expected, "records differ through the cache");
        let s = store.read_cache_stats().unwrap();
        // The 16 readers share blocks: the log is read about once, in blocks, not
        // once per reader (the cache holds 4 MiB of a log larger than that).
        assert!(s.reads > 0 && s.hits + s.shared > s.reads, "{s:?}");
        assert!(
            s.bytes_read <= 2 * log_bytes,
            "read {} bytes for a {log_bytes}-byte log: {s:?}",
            s.bytes_read
        );
        assert_eq!(s.failed, 0);
        assert!(s.blocks <= 64, "cache over its size: {s:?}");
        store.shutdown().await.unwrap();
    });
}

#[test]
fn a_tiny_cache_evicts_and_stays_correct() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    run(move || async move {
        let per_queue = 120;
        let store = Store::open(config(&root, 0, 4096)).await.unwrap();
        fill(&store, 0, per_queue).await;
        store.shutdown().await.unwrap();
        // Two 8 KiB blocks for 16 readers with read-ahead: blocks are evicted before
        // some readers get to them and must be read again.
        let store = Store::open(config(&root, 16 << 10, 8 << 10)).await.unwrap();
        let got = read_all_queues(&store, 32).await;
        check_bodies(&got, per_queue);
        let s = store.read_cache_stats().unwrap();
        assert!(s.evictions > 0, "{s:?}");
        assert!(s.blocks <= 2, "{s:?}");
        // Single reads too (one message per get).
        let one = store.get(TOPIC, 3, 7, 1, 1 << 20).await.unwrap();
        assert_eq!(one.records, vec![got[3][7].clone()]);
        store.shutdown().await.unwrap();
    });
}

#[test]
fn gets_racing_puts_see_exact_records() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    run(move || async move {
        let mut cfg = config(&root, 256 << 10, 16 << 10);
        // Commit often so committed blocks become cacheable while puts go on.
        cfg.commit_interval = std::time::Duration::from_millis(1);
        let store = Store::open(cfg).await.unwrap();
        let rounds = 150u64;
        let writer = {
            let store = store.clone();
            glommio::spawn_local(async move {
                for i in 0..rounds {
                    for q in 0..QUEUES {
                        let r = store.put(msg(TOPIC, q, i)).await;
                        assert_eq!(r.status, PutStatus::PutOk);
                    }
                    glommio::yield_if_needed().await;
                }
            })
        };
        let readers: Vec<_> = (0..QUEUES)
            .map(|q| {
                let store = store.clone();
                glommio::spawn_local(async move {
                    let mut off = 0u64;
                    while off < rounds {
                        let r = store.get(TOPIC, q, off, 16, 1 << 20).await.unwrap();
                        match r.status {
                            GetStatus::Found => {
                                for raw in &r.records {
                                    let m = StoredMessage::decode(raw).unwrap();
                                    assert_eq!((m.queue_id, m.queue_offset), (q, off));
                                    assert_eq!(&m.body[..], &body(TOPIC, q, off)[..]);
                                    off += 1;
                                }
                            }
                            GetStatus::OffsetOverflowOne | GetStatus::NoMessageInQueue => {
                                glommio::timer::sleep(std::time::Duration::from_micros(200)).await;
                            }
                            s => panic!("{q} at {off}: {s:?}"),
                        }
                    }
                })
            })
            .collect();
        writer.await;
        for r in readers {
            r.await;
        }
        // Read it all again now that it is committed: through the cache.
        store.flush().await.unwrap();
        let got = read_all_queues(&store, 64).await;
        check_bodies(&got, rounds);
        let s = store.read_cache_stats().unwrap();
        assert!(s.reads > 0, "the cache was never used: {s:?}");
        store.shutdown().await.unwrap();
    });
}

#[test]
fn reads_after_reopen_and_more_puts() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let cfg = config(&root, 1 << 20, 64 << 10);
    let c = cfg.clone();
    run(move || async move {
        let store = Store::open(c).await.unwrap();
        fill(&store, 0, 100).await;
        store.flush().await.unwrap();
        check_bodies(&read_all_queues(&store, 50).await, 100);
        // Dropped without shutdown: the next open recovers as after a crash.
        drop(store);
    });
    run(move || async move {
        let store = Store::open(cfg.clone()).await.unwrap();
        assert!(!store.report.clean_shutdown);
        check_bodies(&read_all_queues(&store, 50).await, 100);
        fill(&store, 100, 100).await;
        store.flush().await.unwrap();
        check_bodies(&read_all_queues(&store, 50).await, 200);
        store.shutdown().await.unwrap();
        let store = Store::open(cfg).await.unwrap();
        check_bodies(&read_all_queues(&store, 1000).await, 200);
        assert!(store.read_cache_stats().unwrap().reads > 0);
        store.shutdown().await.unwrap();
    });
}

#[test]
fn damaged_bytes_in_a_cached_block_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    run(move || async move {
        let cfg = config(&root, 4 << 20, 64 << 10);
        let store = Store::open(cfg.clone()).await.unwrap();
        fill(&store, 0, 100).await;
        store.shutdown().await.unwrap();
        // Flip one byte of queue 5's message 3 in the first segment (never
        // re-verified by a clean open: it is far below the checkpoint).
        let seg = root.join("commitlog").join(format!("{:020}", 0));
        let mut bytes = std::fs::read(&seg).unwrap();
        let needle = format!("{TOPIC}/5/3:").into_bytes();
        let at = bytes
            .windows(needle.len())
            .position(|w| w == needle)
            .expect("body in segment 0");
        bytes[at + needle.len() + 1] ^= 0x20;
        std::fs::write(&seg, &bytes).unwrap();

        let store = Store::open(cfg).await.unwrap();
        let err = store.get(TOPIC, 5, 0, 32, 1 << 20).await.unwrap_err();
        assert!(matches!(err, Error::Corrupt { .. }), "{err}");
        // Other queues sharing the same blocks still read.
        let ok = store.get(TOPIC, 4, 0, 32, 1 << 20).await.unwrap();
        assert_eq!(ok.records.len(), 32);
        assert!(store.read_cache_stats().unwrap().reads > 0);
        store.shutdown().await.unwrap();
    });
}
