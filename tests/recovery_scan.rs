//! Recovery's read-ahead scan (src/commit_log/reader.rs `LogReader`: reads of
//! `READ_AHEAD_BYTES`, several in flight, records verified in the read buffers) over
//! a log many reads long, with records that span two reads and one that spans
//! several:
//! * every record is verified, recovered and re-dispatched (queues and key index);
//! * damage inside a record that spans reads, in the middle of the log, is refused
//!   (`Error::Corrupt` at that record) and nothing is modified;
//! * a torn tail whose first bad record spans a read boundary is cut at that record.
#[path = "common/child.rs"]
mod child;
mod common;

use child::*;
use coremq::commit_log::READ_AHEAD_BYTES;
use coremq::{Error, FlushMode, GetStatus, Message, PutStatus, Store, StoreConfig, StoredMessage};
use std::path::Path;

const SEG: u64 = 16 << 20;
/// One record longer than two reads.
const BIG: usize = (5 * READ_AHEAD_BYTES / 2) as usize;

fn cfg(root: &Path) -> StoreConfig {
    let mut c = StoreConfig::small_for_tests(root);
    c.commit_log_segment_bytes = SEG;
    c.write_buffer_bytes = 1 << 20;
    c.write_buffer_count = 8;
    c.max_message_bytes = BIG + 4096;
    c.flush_mode = FlushMode::Sync;
    c
}

#[derive(Debug, Clone)]
struct Rec {
    q: i32,
    qoff: u64,
    log_off: u64,
    size: u64,
    body: Vec<u8>,
    key: String,
}

impl Rec {
    fn end(&self) -> u64 {
        self.log_off + self.size
    }
    /// Whether the record crosses a read boundary of the recovery scan.
    fn spans_reads(&self) -> bool {
        self.log_off / READ_AHEAD_BYTES != (self.end() - 1) / READ_AHEAD_BYTES
    }
}

const TOPIC: &str = "Scan";

fn body(i: u64, len: usize) -> Vec<u8> {
    let mut b = format!("{i}|").into_bytes();
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while b.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        b.push(b'a' + (x % 26) as u8);
    }
    b
}

/// About 3 segments' worth of reads (~6 MiB) of 1..40 KiB records over 3 queues, with
/// one record of `BIG` bytes in the middle; clean shutdown.
fn populate(root: &Path) -> Vec<Rec> {
    let root = root.to_path_buf();
    run_ret(move || async move {
        let mut c = cfg(&root);
        c.flush_mode = FlushMode::Async;
        let store = Store::open(c).await.expect("open fresh store");
        let mut recs = Vec::new();
        let mut total = 0usize;
        let mut i = 0u64;
        while total < 6 << 20 {
            let len = if i == 150 {
                BIG
            } else {
                1024 + (i as usize * 7919) % (40 << 10)
            };
            let q = (i % 3) as i32;
            let key = format!("k-{i}");
            let b = body(i, len);
            let r = store
                .put(Message::new(TOPIC, q, b.clone()).with_keys(key.clone()))
                .await;
            assert_eq!(r.status, PutStatus::PutOk);
            total += r.wrote_bytes as usize;
            recs.push(Rec {
                q,
                qoff: r.queue_offset,
                log_off: r.log_offset,
                size: r.wrote_bytes as u64,
                body: b,
                key,
            });
            i += 1;
        }
        store.shutdown().await.expect("clean shutdown");
        recs
    })
}

async fn check_intact(store: &Store, recs: &[Rec], what: &str) {
    for r in recs {
        let g = store.get(TOPIC, r.q, r.qoff, 1, 8 << 20).await.unwrap();
        assert_eq!(
            g.status,
            GetStatus::Found,
            "{what}: {}/{} missing",
            r.q,
            r.qoff
        );
        let m = StoredMessage::decode(&g.records[0]).unwrap();
        assert_eq!(
            m.log_offset, r.log_off,
            "{what}: {}/{} log offset",
            r.q, r.qoff
        );
        assert!(m.body[..] == r.body[..], "{what}: {}/{} body", r.q, r.qoff);
    }
    // The key index was re-dispatched too.
    for r in recs.iter().step_by(17) {
        let hits = store
            .query_by_key(TOPIC, &r.key, 4, 0, i64::MAX)
            .await
            .unwrap();
        assert!(
            hits.iter().any(|m| m.log_offset == r.log_off),
            "{what}: key {} not found",
            r.key
        );
    }
}

/// Nothing trusted: an unclean stop and no usable checkpoint, so the scan verifies
/// and re-dispatches the whole log (queues rebuilt, index rebuilt from its start).
fn crash_without_checkpoint(root: &Path) {
    mark_unclean(root);
    invalidate_checkpoint(root);
    std::fs::remove_dir_all(root.join("consumequeue")).unwrap();
    std::fs::remove_dir_all(root.join("index")).unwrap();
}

#[test]
fn records_spanning_reads_are_verified_and_redispatched() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("s");
    let recs = populate(&root);
    let spanning = recs.iter().filter(|r| r.spans_reads()).count();
    assert!(spanning >= 4, "only {spanning} records span reads");
    assert!(recs[150].size > 2 * READ_AHEAD_BYTES);
    crash_without_checkpoint(&root);
    let root2 = root.clone();
    run_ret(move || async move {
        let store = Store::open(cfg(&root2)).await.expect("recover");
        let rep = store.report.clone();
        assert_eq!(rep.records_scanned, recs.len() as u64, "{rep:?}");
        assert_eq!(rep.entries_rebuilt, recs.len() as u64, "{rep:?}");
        assert!(rep.truncated.is_none(), "{rep:?}");
        assert_eq!(store.max_log_offset(), recs.last().unwrap().end());
        check_intact(&store, &recs, "after recovery").await;
        store.shutdown().await.unwrap();
    });
}

/// A flipped byte in the part of a record that lies in the next read (and in the
/// middle read of the big record): interior damage, refused, nothing modified.
#[test]
fn flip_inside_a_record_spanning_reads_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let pristine = tmp.path().join("pristine");
    let recs = populate(&pristine);
    let n = recs.len();
    let small = recs[n / 3..]
        .iter()
        .find(|r| r.spans_reads() && r.size < READ_AHEAD_BYTES)
        .expect("a small record spanning two reads")
        .clone();
    let boundary = (small.log_off / READ_AHEAD_BYTES + 1) * READ_AHEAD_BYTES;
    let big = recs[150].clone();
    let big_mid = (big.log_off / READ_AHEAD_BYTES + 1) * READ_AHEAD_BYTES + 100;
    assert!(big_mid < big.end() - 100);
    for (name, victim, at) in [
        (
            "small record, byte after the read boundary",
            &small,
            boundary + 5,
        ),
        (
            "small record, byte before the read boundary",
            &small,
            boundary - 5,
        ),
        ("big record, its middle read", &big, big_mid),
    ] {
        assert!(
            at > victim.log_off + 100 && at < victim.end() - 50,
            "{name}: inside the body"
        );
        let root = tmp.path().join(format!("case-{}", victim.log_off + at));
        copy_dir(&pristine, &root);
        flip_log_byte(&root, SEG, at, 0x10);
        mark_unclean(&root);
        invalidate_checkpoint(&root);
        let before = snapshot(&root, &["commitlog", "consumequeue", "checkpoint", "abort"]);
        let root2 = root.clone();
        let res: Result<(), Error> = run_ret(move || async move {
            let store = Store::open(cfg(&root2)).await?;
            store.shutdown().await
        });
        match res {
            Err(Error::Corrupt { path, offset, .. }) => {
                let seg = victim.log_off / SEG * SEG;
                assert_eq!(path, segment_path(&root, seg), "{name}");
                assert_eq!(
                    offset,
                    victim.log_off - seg,
                    "{name}: refused at the record"
                );
            }
            other => panic!("{name}: expected Error::Corrupt, got {other:?}"),
        }
        let after = snapshot(&root, &["commitlog", "consumequeue", "checkpoint", "abort"]);
        assert!(
            diff(&before, &after).is_empty(),
            "{name}: {:?}",
            diff(&before, &after)
        );
    }
}

/// The last writes never landed from a read boundary on: the record spanning it is
/// torn (its second part zeros), everything after it too. The cut is at that record,
/// the records before it survive, and puts continue at the cut.
#[test]
fn torn_tail_across_a_read_boundary_is_cut_at_the_record() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("s");
    let recs = populate(&root);
    let victim_i = recs
        .iter()
        .rposition(|r| r.spans_reads() && r.size < READ_AHEAD_BYTES && r.log_off > 4 << 20)
        .expect("a late record spanning two reads");
    let victim = recs[victim_i].clone();
    let boundary = (victim.log_off / READ_AHEAD_BYTES + 1) * READ_AHEAD_BYTES;
    let end = recs.last().unwrap().end();
    // Zero [boundary, end): within one segment.
    assert_eq!(boundary / SEG, (end - 1) / SEG);
    write_log(&root, SEG, boundary, &vec![0u8; (end - boundary) as usize]);
    crash_without_checkpoint(&root);
    let root2 = root.clone();
    run_ret(move || async move {
        let store = Store::open(cfg(&root2)).await.expect("recover");
        let rep = store.report.clone();
        match rep.truncated {
            Some((at, n)) if at == victim.log_off && n > 0 && n <= boundary - at => {}
            other => panic!(
                "expected a cut at the torn record {} erasing its written part, got {other:?}",
                victim.log_off
            ),
        }
        assert_eq!(store.max_log_offset(), victim.log_off);
        assert_eq!(rep.records_scanned, victim_i as u64);
        check_intact(&store, &recs[..victim_i], "kept records").await;
        let r = store
            .put(Message::new(TOPIC, victim.q, body(9999, 3000)))
            .await;
        assert_eq!(r.status, PutStatus::PutOk);
        assert_eq!(r.log_offset, victim.log_off, "puts continue at the cut");
        assert_eq!(
            r.queue_offset, victim.qoff,
            "with the queue offset that was cut"
        );
        store.shutdown().await.unwrap();
    });
}
