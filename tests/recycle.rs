//! Segment recycling (issue 19, `commit_log_spare_segments`), on the real disk:
//! retired segments are kept in `spare/`, zero-filled, and renamed into place as the
//! next segments (the same inodes come back); what the log holds past its end is zeros
//! (RocketMQ's recovery reads a recycled segment as a fresh one); the store reopens
//! cleanly and after a kill-like unclean shutdown with every message intact; spares
//! over the limit, or with recycling turned off, are deleted at open; under space
//! pressure (simulated disk with a capacity) spares are deleted and retired segments
//! are not kept.

mod common;

use common::{body, msg, read_all};
use coremq::io::{Disk, SimDisk};
use coremq::{FlushMode, PutStatus, Store, StoreConfig};
use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

fn cfg(root: &Path, spares: usize) -> StoreConfig {
    let mut c = StoreConfig::small_for_tests(root);
    c.flush_mode = FlushMode::Sync;
    c.commit_log_spare_segments = spares;
    c.retention.file_reserved_time = Duration::ZERO;
    c.retention.delete_when = String::new();
    c.retention.delete_interval = Duration::ZERO;
    c.retention.clean_interval = Duration::from_secs(3600);
    // The host's disk may be over 75% full: space levels are tested on the
    // simulated disk.
    c.disk_full_ratio = 1.0;
    c.retention.disk_max_used_space_ratio = 1.0;
    c.retention.disk_clean_forcibly_ratio = 1.0;
    c
}

/// Puts messages `from..to` to `T/0`, 50 at a time.
async fn put_range(store: &Store, from: u64, to: u64) {
    let mut i = from;
    while i < to {
        let batch: Vec<_> = (i..(i + 50).min(to)).map(|n| msg("T", 0, n)).collect();
        let r = store.put_batch(&batch).await;
        assert_eq!(r.status, PutStatus::PutOk, "messages {i}..");
        i += 50;
    }
}

/// Everything from the queue's minimum on is there, in order, with its body.
async fn check_queue(store: &Store, last: u64) -> u64 {
    let got = read_all(store, "T", 0).await;
    assert!(!got.is_empty());
    let first = got[0].queue_offset;
    for (k, m) in got.iter().enumerate() {
        let n = first + k as u64;
        assert_eq!(m.queue_offset, n);
        assert_eq!(m.body, body("T", 0, n), "message {n}");
    }
    assert_eq!(
        first + got.len() as u64,
        last,
        "the queue ends at the last put"
    );
    first
}

fn spare_files(root: &Path) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = std::fs::read_dir(root.join("spare"))
        .map(|rd| {
            rd.map(|e| {
                let e = e.unwrap();
                (
                    e.file_name().to_string_lossy().into_owned(),
                    e.metadata().unwrap().ino(),
                )
            })
            .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn segment_inodes(root: &Path) -> BTreeSet<u64> {
    std::fs::read_dir(root.join("commitlog"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().ino())
        .collect()
}

/// Waits until `n` spares are zero-filled and ready.
async fn wait_ready(store: &Store, n: u64) {
    let t = Instant::now();
    while store.stats().spare_segments_ready < n {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "spares not ready: {:?}",
            (
                store.stats().spare_segments_ready,
                store.stats().spare_segments_pending
            )
        );
        glommio::timer::sleep(Duration::from_millis(5)).await;
    }
}

#[test]
fn retired_segments_come_back_zeroed_as_the_next_ones() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    common::run(move || async move {
        let store = Store::open(cfg(&root, 2)).await.unwrap();
        // ~1.6 KiB a message, 1 MiB segments: about 5 segments.
        put_range(&store, 0, 3000).await;
        store.wait_dispatched().await;
        store.checkpoint().await.unwrap();
        glommio::timer::sleep(Duration::from_millis(3)).await;
        let rep = store.delete_expired_files().await.unwrap();
        assert!(rep.expired_segments >= 3, "{rep:?}");
        wait_ready(&store, 2).await;
        let s = store.stats();
        assert_eq!(s.spare_segments_pending, 0, "only two spares are kept");
        let spares = spare_files(&root);
        assert_eq!(spares.len(), 2, "{spares:?}");
        assert!(
            spares.iter().all(|(n, _)| n.ends_with(".ready")),
            "{spares:?}"
        );
        // A ready spare is all zeros.
        for (name, _) in &spares {
            let data = std::fs::read(root.join("spare").join(name)).unwrap();
            assert!(data.iter().all(|b| *b == 0), "{name} is zero-filled");
        }
        let spare_inodes: BTreeSet<u64> = spares.iter().map(|(_, i)| *i).collect();
        let created_before = store.stats().segments_created;

        // Until both spares are segments: no new file meanwhile.
        let mut last = 3000;
        while store.stats().segments_reused < 2 {
            assert!(last < 6000, "spares not used: {:?}", store.stats());
            put_range(&store, last, last + 50).await;
            last += 50;
        }
        assert_eq!(
            store.stats().segments_created,
            created_before,
            "no new file was created"
        );
        put_range(&store, last, 4400.max(last)).await;
        assert!(spare_files(&root).is_empty());
        let inodes = segment_inodes(&root);
        assert!(
            spare_inodes.is_subset(&inodes),
            "the spares' inodes are segments now: {spare_inodes:?} in {inodes:?}"
        );
        // Past the log's end: zeros only, as in a fresh segment (RocketMQ stops there).
        store.wait_dispatched().await;
        let end = store.max_log_offset();
        let seg_bytes = 1u64 << 20;
        let seg = end / seg_bytes * seg_bytes;
        let data = std::fs::read(common_segment(&root, seg)).unwrap();
        assert!(
            data[(end - seg) as usize..].iter().all(|b| *b == 0),
            "zeros past the end of the log"
        );
        check_queue(&store, 4400).await;
        store.shutdown().await.unwrap();

        // Clean reopen, then an unclean one (recovery scans the recycled tail).
        let store = Store::open(cfg(&root, 2)).await.unwrap();
        check_queue(&store, 4400).await;
        put_range(&store, 4400, 4500).await;
        store.shutdown().await.unwrap();
        std::fs::write(root.join("abort"), b"12345").unwrap();
        let store = Store::open(cfg(&root, 2)).await.unwrap();
        check_queue(&store, 4500).await;
        store.shutdown().await.unwrap();
    });
}

fn common_segment(root: &Path, start: u64) -> std::path::PathBuf {
    root.join("commitlog").join(format!("{start:020}"))
}

#[test]
fn spares_over_the_limit_or_with_recycling_off_are_deleted_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    common::run(move || async move {
        let store = Store::open(cfg(&root, 3)).await.unwrap();
        put_range(&store, 0, 3000).await;
        store.wait_dispatched().await;
        store.checkpoint().await.unwrap();
        glommio::timer::sleep(Duration::from_millis(3)).await;
        store.delete_expired_files().await.unwrap();
        wait_ready(&store, 3).await;
        store.shutdown().await.unwrap();
        assert_eq!(spare_files(&root).len(), 3);
        // A stray file and a spare of the wrong size go too.
        std::fs::write(root.join("spare/junk"), b"x").unwrap();
        std::fs::write(root.join("spare/00000000000099999999.ready"), b"short").unwrap();

        let store = Store::open(cfg(&root, 1)).await.unwrap();
        assert_eq!(spare_files(&root).len(), 1, "{:?}", spare_files(&root));
        assert_eq!(store.stats().spare_segments_ready, 1);
        check_queue(&store, 3000).await;
        store.shutdown().await.unwrap();

        let store = Store::open(cfg(&root, 0)).await.unwrap();
        assert!(spare_files(&root).is_empty());
        check_queue(&store, 3000).await;
        store.shutdown().await.unwrap();
    });
}

#[test]
fn a_spare_with_a_second_name_is_not_a_spare() {
    // A crash between the rename into commitlog/ and the directory syncs can leave a
    // file under both names: it must not stay a spare (it would be zeroed and handed
    // out while it is a segment).
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    common::run(move || async move {
        let store = Store::open(cfg(&root, 2)).await.unwrap();
        put_range(&store, 0, 1500).await;
        store.shutdown().await.unwrap();
        std::fs::create_dir_all(root.join("spare")).unwrap();
        let seg0 = common_segment(&root, 0);
        std::fs::hard_link(&seg0, root.join("spare/00000000000000000000.ready")).unwrap();
        let before = std::fs::read(&seg0).unwrap();
        let store = Store::open(cfg(&root, 2)).await.unwrap();
        assert!(spare_files(&root).is_empty());
        assert_eq!(store.stats().spare_segments_ready, 0);
        put_range(&store, 1500, 2600).await;
        check_queue(&store, 2600).await;
        store.shutdown().await.unwrap();
        let after = std::fs::read(&seg0).unwrap();
        assert_eq!(before, after, "the first segment was not touched");
    });
}

#[test]
fn space_pressure_deletes_spares_and_keeps_none() {
    common::run(|| async {
        let disk = SimDisk::new();
        let mut c = cfg(Path::new("/sim/recycle"), 2);
        c.disk = Disk::Sim(disk.clone());
        let store = Store::open(c.clone()).await.unwrap();
        put_range(&store, 0, 3000).await;
        store.wait_dispatched().await;
        store.checkpoint().await.unwrap();
        glommio::timer::sleep(Duration::from_millis(3)).await;
        store.delete_expired_files().await.unwrap();
        wait_ready(&store, 2).await;
        store.shutdown().await.unwrap();
        let spares = |d: &SimDisk| {
            d.files()
                .iter()
                .filter(|p| p.starts_with("/sim/recycle/spare"))
                .count()
        };
        assert_eq!(spares(&disk), 2);

        // Then the disk is 80% full: over disk_max_used_space_ratio.
        c.retention.disk_max_used_space_ratio = 0.75;
        // One segment a pass: below 75% again, a retired segment would be kept.
        c.retention.delete_file_batch_max = 1;
        let store = Store::open(c.clone()).await.unwrap();
        put_range(&store, 3000, 4000).await;
        store.wait_dispatched().await;
        store.checkpoint().await.unwrap();
        let used: u64 = disk
            .files()
            .iter()
            .map(|p| disk.contents(p).map_or(0, |c| c.len() as u64))
            .sum();
        disk.set_capacity(Some(used * 5 / 4));
        glommio::timer::sleep(Duration::from_millis(3)).await;
        let rep = store.delete_expired_files().await.unwrap();
        assert_eq!(rep.expired_segments, 1, "{rep:?}");
        let s = store.stats();
        assert_eq!(
            (s.spare_segments_ready, s.spare_segments_pending),
            (0, 0),
            "spares deleted, none kept: {s:?}"
        );
        assert_eq!(spares(&disk), 0);
        check_queue(&store, 4000).await;
        store.shutdown().await.unwrap();
    });
}
