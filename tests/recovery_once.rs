//! One-pass recovery (src/store/recovery/ `Store::open`): the scan that verifies the log hands
//! its records to the ConsumeQueues and the key index, each from its own resume point.
//! These tests check that every kept record is dispatched exactly once and nothing past
//! the recovered end is: after recovery and a clean shutdown, every queue file's entries
//! and the key index's entries (in order, `(key hash, commit-log offset)`) equal those of
//! a store that wrote the same log without crashing, cut to the recovered end.
//!
//! Each case starts from one run: `N1` messages, a checkpoint (queues and index flushed),
//! `N2` more, the log flushed, and a copy of the files taken while the store still runs
//! (as a kill -9 leaves them: queues behind, `abort` present); the running store then
//! shuts down cleanly and is the reference. Cases:
//! * queues and index behind the log;
//! * behind, with a torn last record (cut; not dispatched);
//! * ahead: the log lost its last records after queues and index had taken them;
//! * mixed: queues behind, index ahead of a log that lost its tail;
//! * the index deleted (rebuilt from the first record) while the queues are complete:
//!   the queues must take nothing.
#[path = "common/child.rs"]
mod child;
mod common;

use child::*;
use coremq::format::consume_queue::{CqEntry, ENTRY_LEN as CQ_ENTRY};
use coremq::format::index_file::{ENTRY_LEN, Geometry, IndexEntry, IndexHeader};
use coremq::{FlushMode, Message, OpenReport, PutStatus, Store, StoreConfig};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

const N1: u64 = 300;
const N2: u64 = 260;
const QUEUES: i32 = 3;
const TOPIC: &str = "Once";

fn cfg(root: &Path) -> StoreConfig {
    let mut c = StoreConfig::small_for_tests(root);
    c.flush_mode = FlushMode::Async;
    // Only explicit checkpoints flush queues and index (the copy must not race one).
    c.consume_queue_flush_interval = Duration::from_secs(3600);
    c
}

/// Every queue's entries: (phys offset, size, tags code), by queue id.
type Queues = BTreeMap<i32, Vec<(i64, i32, i64)>>;

#[derive(Debug, Clone)]
struct Rec {
    log_off: u64,
    size: u64,
}

fn message(i: u64) -> Message {
    let len = 200 + (i as usize * 7919) % 2500;
    let mut b = format!("{i}|").into_bytes();
    while b.len() < len {
        b.push(b'a' + (b.len() % 26) as u8);
    }
    Message::new(TOPIC, (i % QUEUES as u64) as i32, b)
        .with_tags(format!("tag{}", i % 4))
        .with_keys(format!("key-{i} shared{}", i % 7))
}

/// Writes the reference store at `reference` and the crash copy at `crashed`; returns
/// every record in log order.
fn build(reference: &Path, crashed: &Path) -> Vec<Rec> {
    let (reference, crashed) = (reference.to_path_buf(), crashed.to_path_buf());
    run_ret(move || async move {
        let store = Store::open(cfg(&reference))
            .await
            .expect("open fresh store");
        let mut recs = Vec::new();
        for i in 0..N1 + N2 {
            let r = store.put(message(i)).await;
            assert_eq!(r.status, PutStatus::PutOk, "put {i}");
            recs.push(Rec {
                log_off: r.log_offset,
                size: r.wrote_bytes as u64,
            });
            if i + 1 == N1 {
                store.wait_dispatched().await;
                store.checkpoint().await.expect("checkpoint");
            }
        }
        store.wait_dispatched().await;
        store.flush().await.expect("flush");
        copy_dir(&reference, &crashed);
        assert!(crashed.join("abort").exists());
        store.shutdown().await.expect("clean shutdown");
        recs
    })
}

/// Every queue's entries (phys offset, size, tags code), read from its files.
fn queue_entries(root: &Path) -> Queues {
    let mut out = BTreeMap::new();
    for q in 0..QUEUES {
        let dir = root.join("consumequeue").join(TOPIC).join(q.to_string());
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map(|rd| rd.map(|e| e.unwrap().path()).collect())
            .unwrap_or_default();
        files.sort();
        let mut v = Vec::new();
        'files: for f in files {
            let bytes = std::fs::read(&f).unwrap();
            for chunk in bytes.chunks_exact(CQ_ENTRY) {
                match CqEntry::decode(chunk) {
                    Some(e) if e.is_valid() => v.push((e.phys_offset, e.size, e.tags_code)),
                    _ => break 'files,
                }
            }
        }
        out.insert(q, v);
    }
    out
}

/// The key index's entries in file order: (key hash, commit-log offset).
fn index_entries(root: &Path) -> Vec<(i32, i64)> {
    let c = cfg(root);
    let geo = Geometry {
        slots: c.index_hash_slots,
        entries: c.index_max_entries,
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(root.join("index"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let bytes = std::fs::read(&f).unwrap();
        let h = IndexHeader::decode(&bytes).unwrap();
        for i in 1..h.index_count.max(1) as u32 {
            let at = geo.entry_pos(i) as usize;
            let e = IndexEntry::decode(&bytes[at..at + ENTRY_LEN]).unwrap();
            out.push((e.key_hash, e.phy_offset));
        }
    }
    out
}

/// Opens (recovering) and shuts down cleanly; returns the open's report.
fn recover(root: &Path) -> OpenReport {
    let root = root.to_path_buf();
    run_ret(move || async move {
        let store = Store::open(cfg(&root)).await.expect("recovery open");
        let report = (*store.report).clone();
        store.shutdown().await.expect("shutdown after recovery");
        report
    })
}

/// The reference's entries for records that start below `end`.
fn cut_reference(queues: &Queues, index: &[(i32, i64)], end: u64) -> (Queues, Vec<(i32, i64)>) {
    let q = queues
        .iter()
        .map(|(k, v)| {
            (
                *k,
                v.iter().filter(|e| (e.0 as u64) < end).copied().collect(),
            )
        })
        .collect();
    let ix = index
        .iter()
        .filter(|e| (e.1 as u64) < end)
        .copied()
        .collect();
    (q, ix)
}

/// Asserts queues equal and the index equal, allowing (when `allow_reindexed`) the one
/// documented duplicate: after an index is cut, the record its repair marks to index
/// again may have its keys twice (src/index/; queries return it once).
fn assert_same(
    what: &str,
    got_q: &Queues,
    got_ix: &[(i32, i64)],
    want_q: &Queues,
    want_ix: &[(i32, i64)],
    allow_reindexed: bool,
) {
    for (q, want) in want_q {
        let got = &got_q[q];
        assert_eq!(
            got.len(),
            want.len(),
            "{what}: queue {q} has {} entries, the reference {}",
            got.len(),
            want.len()
        );
        assert!(got == want, "{what}: queue {q} entries differ");
    }
    let mut got_ix = got_ix.to_vec();
    if allow_reindexed {
        let before = got_ix.len();
        let mut seen = std::collections::HashSet::new();
        let dup_records: std::collections::BTreeSet<i64> = got_ix
            .iter()
            .filter(|e| !seen.insert(**e))
            .map(|e| e.1)
            .collect();
        assert!(
            dup_records.len() <= 1,
            "{what}: more than one record indexed twice: {dup_records:?}"
        );
        let mut seen = std::collections::HashSet::new();
        got_ix.retain(|e| seen.insert(*e));
        assert!(before - got_ix.len() <= 3, "{what}: too many repeated keys");
    }
    assert_eq!(
        got_ix.len(),
        want_ix.len(),
        "{what}: index has {} entries, the reference {}",
        got_ix.len(),
        want_ix.len()
    );
    assert!(got_ix == want_ix, "{what}: index entries differ");
}

struct Case {
    _tmp: tempfile::TempDir,
    reference: PathBuf,
    crashed: PathBuf,
    recs: Vec<Rec>,
    ref_q: Queues,
    ref_ix: Vec<(i32, i64)>,
}

fn setup() -> Case {
    let tmp = tempfile::tempdir().unwrap();
    let reference = tmp.path().join("reference");
    let crashed = tmp.path().join("crashed");
    let recs = build(&reference, &crashed);
    let ref_q = queue_entries(&reference);
    let ref_ix = index_entries(&reference);
    let total: usize = ref_q.values().map(|v| v.len()).sum();
    assert_eq!(total as u64, N1 + N2, "reference queues");
    assert!(ref_ix.len() as u64 >= 2 * (N1 + N2), "reference index");
    // The crash copy's queues stop at the checkpoint.
    let crashed_total: usize = queue_entries(&crashed).values().map(|v| v.len()).sum();
    assert_eq!(crashed_total as u64, N1, "crash copy queues");
    Case {
        _tmp: tmp,
        reference,
        crashed,
        recs,
        ref_q,
        ref_ix,
    }
}

#[test]
fn behind_the_log_every_record_is_dispatched_once() {
    let c = setup();
    let report = recover(&c.crashed);
    assert!(!report.clean_shutdown);
    assert!(report.truncated.is_none());
    assert_eq!(
        report.entries_rebuilt, N2,
        "queue entries placed by recovery"
    );
    let end = c.recs.last().map(|r| r.log_off + r.size).unwrap();
    let (want_q, want_ix) = cut_reference(&c.ref_q, &c.ref_ix, end);
    assert_same(
        "behind",
        &queue_entries(&c.crashed),
        &index_entries(&c.crashed),
        &want_q,
        &want_ix,
        false,
    );
    // Once more: a clean reopen dispatches nothing.
    let again = recover(&c.crashed);
    assert_eq!(again.entries_rebuilt, 0);
    assert!(index_entries(&c.crashed) == want_ix);
}

#[test]
fn torn_last_record_is_cut_and_never_dispatched() {
    let c = setup();
    let last = c.recs.last().unwrap().clone();
    let seg = cfg(&c.crashed).commit_log_segment_bytes;
    // The record's last bytes never landed: it was never durable, so the flush mark
    // (which the copy took after the log was flushed) stops before it.
    write_log(&c.crashed, seg, last.log_off + last.size - 40, &[0u8; 40]);
    forge_flush_mark(&c.crashed, last.log_off);
    let report = recover(&c.crashed);
    assert_eq!(report.log_end, last.log_off, "log cut at the torn record");
    assert_eq!(report.entries_rebuilt, N2 - 1);
    let (want_q, want_ix) = cut_reference(&c.ref_q, &c.ref_ix, last.log_off);
    assert_same(
        "torn tail",
        &queue_entries(&c.crashed),
        &index_entries(&c.crashed),
        &want_q,
        &want_ix,
        false,
    );
}

/// Zeroes the log from record `recs[k]` on (it never reached the disk) and forges the
/// checkpoint a crash would leave: flushed up to there, dispatched past it.
fn lose_log_tail(root: &Path, recs: &[Rec], k: usize) -> u64 {
    let seg = cfg(root).commit_log_segment_bytes;
    let cut = recs[k].log_off;
    let end = recs.last().map(|r| r.log_off + r.size).unwrap();
    let mut at = cut;
    while at < end {
        let n = (end - at).min(seg - at % seg);
        write_log(root, seg, at, &vec![0u8; n as usize]);
        at += n;
    }
    forge_checkpoint(root, cut, end);
    mark_unclean(root);
    cut
}

#[test]
fn queues_and_index_ahead_of_the_log_are_cut_back() {
    let c = setup();
    // The reference itself, after a clean shutdown, has both structures complete.
    let k = c.recs.len() - 25;
    let cut = lose_log_tail(&c.reference, &c.recs, k);
    let report = recover(&c.reference);
    assert_eq!(report.log_end, cut);
    assert_eq!(
        report.entries_rebuilt, 0,
        "queues were complete below the cut"
    );
    let (want_q, want_ix) = cut_reference(&c.ref_q, &c.ref_ix, cut);
    let got_ix = index_entries(&c.reference);
    assert!(
        got_ix.iter().all(|e| (e.1 as u64) < cut),
        "index names a record past the recovered end"
    );
    assert_same(
        "ahead",
        &queue_entries(&c.reference),
        &got_ix,
        &want_q,
        &want_ix,
        true,
    );
}

#[test]
fn queues_behind_and_index_ahead_each_resume_at_their_own_point() {
    let c = setup();
    // The crash copy's queues (at the checkpoint) with the reference's complete index.
    std::fs::remove_dir_all(c.crashed.join("index")).unwrap();
    copy_dir(&c.reference.join("index"), &c.crashed.join("index"));
    let k = c.recs.len() - 40;
    // The crash copy's checkpoint says dispatched up to N1's end: keep that.
    let (_, dispatched) = read_checkpoint(&c.crashed).unwrap();
    let cut = lose_log_tail(&c.crashed, &c.recs, k);
    forge_checkpoint(&c.crashed, dispatched.min(cut), dispatched);
    let report = recover(&c.crashed);
    assert_eq!(report.log_end, cut);
    assert_eq!(report.entries_rebuilt, k as u64 - N1, "queue entries N1..k");
    let (want_q, want_ix) = cut_reference(&c.ref_q, &c.ref_ix, cut);
    assert_same(
        "mixed",
        &queue_entries(&c.crashed),
        &index_entries(&c.crashed),
        &want_q,
        &want_ix,
        true,
    );
}

#[test]
fn deleted_index_is_rebuilt_while_complete_queues_take_nothing() {
    let c = setup();
    std::fs::remove_dir_all(c.reference.join("index")).unwrap();
    let report = recover(&c.reference);
    assert!(report.clean_shutdown);
    assert_eq!(report.entries_rebuilt, 0);
    assert_same(
        "index rebuilt",
        &queue_entries(&c.reference),
        &index_entries(&c.reference),
        &c.ref_q,
        &c.ref_ix,
        false,
    );
}
