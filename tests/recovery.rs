//! Recovery from file-level damage after a clean or unclean stop.
//!
//! Each test builds a store, stops it, damages files under the root with `std::fs`
//! (the store is not running), and reopens. An unclean stop is simulated by creating
//! `<root>/abort` (a crash leaves it) and, where the scenario needs a checkpoint that
//! lags the log, by rewriting the checkpoint's offsets or zeroing it (no coremq
//! section: recovery scans the whole log and assumes nothing durable).
//!
//! The rules under test (src/store/recovery/, src/commit_log/recovery/, README "Recovery"):
//! * a torn tail is cut (and reported) and puts continue at the cut;
//! * damage followed by valid records, or below the checkpoint's flushed offset, is
//!   refused with `Error::Corrupt` naming the file and offset, and nothing is modified;
//! * ConsumeQueues are rebuilt from the CommitLog when they are missing;
//! * one store per directory (`Error::Locked`);
//! * a restart keeps every offset and time answer.
#[path = "common/child.rs"]
mod child;
mod common;

use child::*;
use common::run;
use coremq::{Error, FlushMode, GetStatus, Message, PutStatus, Store, StoreConfig, StoredMessage};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn cfg(root: &Path) -> StoreConfig {
    let mut c = StoreConfig::small_for_tests(root);
    c.flush_mode = FlushMode::Sync;
    c
}

fn seg_bytes(root: &Path) -> u64 {
    cfg(root).commit_log_segment_bytes
}

/// One stored message, as its put reported it.
#[derive(Debug, Clone)]
struct Rec {
    topic: String,
    q: i32,
    qoff: u64,
    log_off: u64,
    size: u64,
    body: Vec<u8>,
    ts: i64,
}

impl Rec {
    fn end(&self) -> u64 {
        self.log_off + self.size
    }
}

fn body_for(topic: &str, q: i32, i: u64, len: usize) -> Vec<u8> {
    let mut b = format!("{topic}/{q}/{i}|").into_bytes();
    let mut rng = Rng::new(i * 31 + q as u64);
    while b.len() < len {
        b.push(b'a' + (rng.next_u64() % 26) as u8);
    }
    b.truncate(len.max(1));
    b
}

fn message(topic: &str, q: i32, i: u64, len: usize) -> Message {
    Message::new(topic, q, body_for(topic, q, i, len))
        .with_tags(format!("tag{}", i % 3))
        .with_keys(format!("key-{i}"))
}

async fn put_all(store: &Store, msgs: Vec<Message>) -> Vec<Rec> {
    let mut out = Vec::new();
    for m in msgs {
        let r = store.put(m.clone()).await;
        assert_eq!(r.status, PutStatus::PutOk, "put {}/{}", m.topic, m.queue_id);
        out.push(Rec {
            topic: m.topic.clone(),
            q: m.queue_id,
            qoff: r.queue_offset,
            log_off: r.log_offset,
            size: r.wrote_bytes as u64,
            body: m.body.to_vec(),
            ts: r.store_timestamp_ms,
        });
    }
    store.wait_dispatched().await;
    out
}

/// `n` messages round-robin over `queues`, bodies of `len(i)` bytes.
fn messages(queues: &[(&str, i32)], n: u64, len: impl Fn(u64) -> usize) -> Vec<Message> {
    (0..n)
        .map(|i| {
            let (t, q) = queues[(i % queues.len() as u64) as usize];
            message(t, q, i, len(i))
        })
        .collect()
}

/// Opens a fresh store at `root`, puts `msgs`, shuts down cleanly. (Async flush for
/// speed: the clean shutdown makes everything durable.)
fn populate(root: &Path, msgs: Vec<Message>) -> Vec<Rec> {
    let root = root.to_path_buf();
    run_ret(move || async move {
        let mut c = cfg(&root);
        c.flush_mode = FlushMode::Async;
        let store = Store::open(c).await.expect("open fresh store");
        let recs = put_all(&store, msgs).await;
        store.shutdown().await.expect("clean shutdown");
        recs
    })
}

/// Every record in `recs` is readable at its queue offset with its log offset and body,
/// and through `look_by_offset`.
async fn check_intact(store: &Store, recs: &[Rec], what: &str) {
    for r in recs {
        let g = store.get(&r.topic, r.q, r.qoff, 1, 1 << 20).await.unwrap();
        assert_eq!(
            g.status,
            GetStatus::Found,
            "{what}: {}/{} queue offset {} not found",
            r.topic,
            r.q,
            r.qoff
        );
        let m = StoredMessage::decode(&g.records[0]).unwrap_or_else(|e| {
            panic!(
                "{what}: {}/{}/{} does not decode: {e}",
                r.topic, r.q, r.qoff
            )
        });
        assert_eq!(
            m.log_offset, r.log_off,
            "{what}: {}/{}/{} log offset",
            r.topic, r.q, r.qoff
        );
        assert_eq!(m.queue_offset, r.qoff);
        assert_eq!(
            &m.body[..],
            &r.body[..],
            "{what}: {}/{}/{} body",
            r.topic,
            r.q,
            r.qoff
        );
        let by_off = store.look_by_offset(r.log_off).await.unwrap();
        assert!(
            by_off.is_some_and(|m| m.body[..] == r.body[..]),
            "{what}: look_by_offset({})",
            r.log_off
        );
    }
}

/// Opens the store; the error is returned for the test to judge.
fn try_open(root: &Path) -> Result<(), Error> {
    let root = root.to_path_buf();
    run_ret(move || async move {
        let store = Store::open(cfg(&root)).await?;
        store.shutdown().await
    })
}

fn bytes_at(root: &Path, log_off: u64, len: u64) -> Vec<u8> {
    let sb = seg_bytes(root);
    let start = log_off / sb * sb;
    let data = std::fs::read(segment_path(root, start)).unwrap();
    data[(log_off - start) as usize..(log_off - start + len) as usize].to_vec()
}

const QS: [(&str, i32); 3] = [("RecA", 0), ("RecA", 1), ("RecB", 0)];

// ---------------------------------------------------------------------------------
// Torn tails.

/// After `damage` (which must leave a torn tail starting at `cut`), an unclean reopen
/// cuts exactly there, keeps everything before, continues puts at the cut, and the
/// continuation survives a clean and an unclean restart.
fn torn_tail_case(
    name: &str,
    root: &Path,
    recs: &[Rec],
    cut: u64,
    expect_erased: Option<u64>,
) -> Result<(), String> {
    let kept: Vec<Rec> = recs.iter().filter(|r| r.log_off < cut).cloned().collect();
    let dropped: Vec<Rec> = recs.iter().filter(|r| r.log_off >= cut).cloned().collect();
    let root_buf = root.to_path_buf();
    let name_s = name.to_string();
    let outcome = std::thread::spawn(move || {
        run_ret(move || async move {
            let root = root_buf;
            let name = name_s;
            let store = Store::open(cfg(&root)).await.map_err(|e| format!("{name}: reopen failed: {e}"))?;
            let rep = store.report.clone();
            let mut errs = Vec::new();
            match rep.truncated {
                Some((at, n)) if at == cut => {
                    if let Some(exp) = expect_erased
                        && n != exp
                    {
                        errs.push(format!("{name}: truncated {n} bytes, expected {exp}"));
                    }
                    if bytes_at(&root, at, n).iter().any(|b| *b != 0) {
                        errs.push(format!("{name}: the {n} bytes cut at {at} are not zero on disk"));
                    }
                }
                other => errs.push(format!(
                    "{name}: report.truncated = {other:?}, expected a cut at {cut} (report {rep:?})"
                )),
            }
            if store.max_log_offset() != cut {
                errs.push(format!("{name}: max_log_offset {} != cut point {cut}", store.max_log_offset()));
            }
            if !errs.is_empty() {
                store.shutdown().await.ok();
                return Err(errs.join("\n"));
            }
            check_intact(&store, &kept, &name).await;
            for d in &dropped {
                let max = store.max_queue_offset(&d.topic, d.q);
                if max > d.qoff {
                    return Err(format!(
                        "{name}: {}/{} still serves queue offset {} (max {max}) whose record was cut",
                        d.topic, d.q, d.qoff
                    ));
                }
            }
            // New puts continue at the cut, with the queue offsets that were cut.
            let mut next = Vec::new();
            for d in dropped.iter().take(3) {
                let r = store.put(message(&d.topic, d.q, 10_000 + d.qoff, 200)).await;
                assert_eq!(r.status, PutStatus::PutOk);
                assert_eq!(r.queue_offset, d.qoff, "{name}: queue offset after the cut");
                next.push(Rec {
                    topic: d.topic.clone(),
                    q: d.q,
                    qoff: r.queue_offset,
                    log_off: r.log_offset,
                    size: r.wrote_bytes as u64,
                    body: body_for(&d.topic, d.q, 10_000 + d.qoff, 200),
                    ts: r.store_timestamp_ms,
                });
            }
            if let Some(first) = next.first() {
                assert_eq!(first.log_off, cut, "{name}: the first put after the cut must land at the cut");
            }
            store.wait_dispatched().await;
            check_intact(&store, &next, &name).await;
            store.shutdown().await.unwrap();
            let mut all = kept.clone();
            all.extend(next.iter().cloned());
            // Clean restart.
            let store = Store::open(cfg(&root)).await.unwrap();
            assert!(store.report.truncated.is_none(), "{name}: second cut after a clean restart");
            check_intact(&store, &all, &format!("{name} after clean restart")).await;
            store.shutdown().await.unwrap();
            // Unclean restart with nothing trusted: the continuation is still valid.
            mark_unclean(&root);
            invalidate_checkpoint(&root);
            let store = Store::open(cfg(&root)).await.unwrap();
            assert!(store.report.truncated.is_none(), "{name}: data cut after a full rescan: {:?}", store.report);
            check_intact(&store, &all, &format!("{name} after full rescan")).await;
            store.shutdown().await.unwrap();
            Ok(())
        })
    })
    .join();
    match outcome {
        Ok(r) => r,
        Err(p) => Err(format!("{name}: panicked: {}", panic_text(&p))),
    }
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "?".into())
}

#[test]
fn torn_tail_garbage_after_the_last_record_is_cut() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("s");
    let recs = populate(&root, messages(&QS, 60, |i| 100 + (i as usize * 37) % 900));
    let end = recs.last().unwrap().end();
    let mut garbage = vec![0u8; 3000];
    Rng::new(42).fill(&mut garbage);
    garbage[0] |= 0x40;
    garbage[2999] |= 0x01;
    write_log(&root, seg_bytes(&root), end, &garbage);
    mark_unclean(&root);
    torn_tail_case("garbage after the end", &root, &recs, end, Some(3000)).unwrap();
}

#[test]
fn torn_tail_record_cut_in_its_body_is_cut() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("s");
    let recs = populate(&root, messages(&QS, 60, |i| 100 + (i as usize * 37) % 900));
    let last = recs.last().unwrap().clone();
    // The record's last page never reached the disk: zeros from mid-body on.
    let from = last.log_off + 88 + 20;
    write_log(
        &root,
        seg_bytes(&root),
        from,
        &vec![0u8; (last.end() - from) as usize],
    );
    // As a crash leaves it: the checkpoint covers everything but the last record.
    forge_checkpoint(&root, last.log_off, last.log_off);
    mark_unclean(&root);
    torn_tail_case(
        "record zeroed from mid-body",
        &root,
        &recs,
        last.log_off,
        Some(108),
    )
    .unwrap();
}

/// The record's last bytes (its properties' tail, where the record-CRC property
/// lives) are zero: a torn write whose last page did not land. The body is intact.
#[test]
fn torn_tail_record_missing_its_last_bytes_is_cut() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("s");
    let recs = populate(&root, messages(&QS, 60, |i| 100 + (i as usize * 37) % 900));
    let last = recs.last().unwrap().clone();
    let zeroed = 30; // the 20-byte record-CRC property and the end of KEYS
    write_log(
        &root,
        seg_bytes(&root),
        last.end() - zeroed,
        &vec![0u8; zeroed as usize],
    );
    forge_checkpoint(&root, last.log_off, last.log_off);
    mark_unclean(&root);
    torn_tail_case(
        "record missing its last 30 bytes",
        &root,
        &recs,
        last.log_off,
        None,
    )
    .unwrap();
}

// ---------------------------------------------------------------------------------
// Bit flips in the last record when nothing vouches for it.

#[test]
fn bit_flip_in_the_last_record_without_checkpoint_cuts_just_that_record() {
    let tmp = tempfile::tempdir().unwrap();
    let pristine = tmp.path().join("pristine");
    let mut msgs = messages(&QS, 45, |i| 100 + (i as usize * 37) % 900);
    msgs.push(message("RecA", 0, 45, 300));
    let recs = populate(&pristine, msgs);
    let last = recs.last().unwrap().clone();
    let raw = bytes_at(&pristine, last.log_off, last.size);
    // Layout: 88 header bytes, the 300-byte body, topic length 4, "RecA".
    assert_eq!(
        (raw[388], &raw[389..393]),
        (4, &b"RecA"[..]),
        "record layout"
    );
    let find = |needle: &[u8]| raw.windows(needle.len()).position(|w| w == needle).unwrap() as u64;
    let tags_at = find(b"TAGS");
    let crc_at = find(b"__CRC32#");
    assert_eq!(crc_at, last.size - 20);
    let cases: Vec<(&str, u64, u8)> = vec![
        ("total size, high bit", 0, 0x80),
        ("total size, low bit", 3, 0x01),
        ("magic", 5, 0x01),
        ("body crc", 9, 0x01),
        ("queue id", 15, 0x01),
        ("queue offset", 27, 0x01),
        ("physical offset", 35, 0x01),
        ("sysflag: born host IPv6", 39, 0x10),
        ("sysflag: transaction prepared", 39, 0x04),
        ("store timestamp", 63, 0x01),
        ("body length", 87, 0x01),
        ("first body byte", 88, 0x01),
        ("middle body byte", 88 + 150, 0x20),
        ("topic length", 388, 0x01),
        ("topic", 390, 0x01),
        ("properties length", 394, 0x01),
        ("TAGS name", tags_at, 0x01),
        ("TAGS value", tags_at + 5, 0x01),
        ("CRC digit (still a digit)", crc_at + 12, 0x01),
        ("CRC digit (becomes a letter)", crc_at + 12, 0x40),
        ("CRC property name", crc_at, 0x01),
        ("CRC name/value separator", crc_at + 8, 0x01),
        ("final property separator", last.size - 1, 0x01),
    ];
    let mut failures = Vec::new();
    let mut runs = 0;
    for (i, (name, pos, mask)) in cases.iter().enumerate() {
        // As a crash leaves it (a valid checkpoint that lags the log), and with no
        // usable checkpoint at all (recovery must then trust nothing).
        for lagging in [true, false] {
            let root = tmp.path().join(format!("case{i}-{lagging}"));
            copy_dir(&pristine, &root);
            flip_log_byte(&root, seg_bytes(&root), last.log_off + pos, *mask);
            let cp = if lagging {
                forge_checkpoint(&root, last.log_off, last.log_off);
                "lagging checkpoint"
            } else {
                invalidate_checkpoint(&root);
                "unusable checkpoint"
            };
            mark_unclean(&root);
            let label = format!("flip {name} (record byte {pos}, mask {mask:#04x}), {cp}");
            runs += 1;
            if let Err(e) = torn_tail_case(&label, &root, &recs, last.log_off, Some(last.size)) {
                failures.push(e);
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {runs} damaged stores mishandled:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

// ---------------------------------------------------------------------------------
// Damage that must be refused, leaving every file as it was.

fn expect_refused(root: &Path, bad_log_off: u64, what: &str) -> Result<(), String> {
    let before = snapshot(root, &["commitlog", "consumequeue", "checkpoint", "abort"]);
    let sb = seg_bytes(root);
    let seg_start = bad_log_off / sb * sb;
    let seg = segment_path(root, seg_start);
    let result = try_open(root);
    let after = snapshot(root, &["commitlog", "consumequeue", "checkpoint", "abort"]);
    let changed = diff(&before, &after);
    let mut errs = Vec::new();
    match &result {
        Err(e @ Error::Corrupt { path, offset, .. }) => {
            let text = e.to_string();
            if path != &seg {
                errs.push(format!("{what}: Corrupt names {} instead of {}", path.display(), seg.display()));
            }
            if *offset != bad_log_off - seg_start {
                errs.push(format!(
                    "{what}: Corrupt offset {offset}, expected {} (commit-log offset {bad_log_off})",
                    bad_log_off - seg_start
                ));
            }
            let file_name = seg.file_name().unwrap().to_str().unwrap();
            if !text.contains(file_name) || !text.contains(&(bad_log_off - seg_start).to_string()) {
                errs.push(format!("{what}: message does not name file and offset: {text}"));
            }
        }
        Err(e) => errs.push(format!("{what}: expected Error::Corrupt, got {e:?}")),
        Ok(()) => errs.push(format!(
            "{what}: Store::open succeeded although the record at commit-log offset {bad_log_off} is damaged"
        )),
    }
    if !changed.is_empty() {
        errs.push(format!("{what}: open modified files: {changed:?}"));
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs.join("\n"))
    }
}

/// A damaged record in the middle of the log with valid records after it (nothing
/// vouches for the log: unclean stop, no checkpoint) is interior corruption.
#[test]
fn interior_flip_is_refused_and_nothing_is_modified() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("s");
    let recs = populate(&root, messages(&QS, 90, |i| 100 + (i as usize * 37) % 900));
    let victim = recs[45].clone();
    let sb = seg_bytes(&root);
    flip_log_byte(&root, sb, victim.log_off + 88 + 10, 0x04);
    invalidate_checkpoint(&root);
    mark_unclean(&root);
    expect_refused(&root, victim.log_off, "interior flip, no checkpoint").unwrap();
    // Refusal released the lock and changed nothing: repair the byte and all is there.
    flip_log_byte(&root, sb, victim.log_off + 88 + 10, 0x04);
    let root2 = root.clone();
    run(move || async move {
        let store = Store::open(cfg(&root2)).await.expect("reopen after repair");
        assert!(store.report.truncated.is_none());
        check_intact(&store, &recs, "after repair").await;
        store.shutdown().await.unwrap();
    });
}

/// Same damage after a clean stop with a valid checkpoint that covers the whole log:
/// the record is below the flushed offset, so it must be refused too (a store that
/// opens anyway serves a record whose checksum fails, and `look_by_offset` loses an
/// acknowledged message).
#[test]
fn interior_flip_after_clean_stop_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("s");
    let recs = populate(&root, messages(&QS, 90, |i| 100 + (i as usize * 37) % 900));
    // Near the end of the last (only) segment: even a RocketMQ-style "recheck the last
    // segments" recovery reads it.
    let victim = recs[recs.len() - 4].clone();
    flip_log_byte(&root, seg_bytes(&root), victim.log_off + 88 + 10, 0x04);
    assert!(read_checkpoint(&root).is_some_and(|(f, _)| f >= recs.last().unwrap().end()));
    expect_refused(&root, victim.log_off, "interior flip after clean stop").unwrap();
}

/// The last record is below the checkpoint's flushed offset (clean shutdown: the
/// checkpoint covers everything): damage there is acknowledged data, refused.
#[test]
fn flip_below_the_checkpointed_flushed_offset_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let pristine = tmp.path().join("pristine");
    let recs = populate(
        &pristine,
        messages(&QS, 60, |i| 100 + (i as usize * 37) % 900),
    );
    let last = recs.last().unwrap().clone();
    let mut failures = Vec::new();
    for (case, unclean) in [
        ("clean stop", false),
        ("crash right after the checkpoint", true),
    ] {
        let root = tmp.path().join(case.replace(' ', "-"));
        copy_dir(&pristine, &root);
        flip_log_byte(&root, seg_bytes(&root), last.log_off + 88 + 5, 0x01);
        if unclean {
            mark_unclean(&root);
        }
        if let Err(e) = expect_refused(&root, last.log_off, &format!("last record flipped, {case}"))
        {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A power loss tears the last unsynced writes: a sector in the middle of the last
/// records never landed (zeros) while later sectors did. Nothing after the hole was
/// acknowledged (an acknowledged record's fdatasync covered everything before it), so
/// recovery cuts at the hole, keeps the cut bytes in `lost+found/`, and the records
/// before the hole are intact. (Found by the simulated disk, tests/sim.rs.)
#[test]
fn torn_sector_before_valid_records_in_the_last_writes_is_cut_and_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("s");
    let recs = populate(&root, messages(&QS, 60, |i| 700 + (i as usize * 37) % 500));
    let sb = seg_bytes(&root);
    let victim = recs[recs.len() - 6].clone();
    // Zero the 512-byte sector after the one holding the victim's start.
    let sector = (victim.log_off / 512 + 1) * 512;
    assert!(sector + 512 < victim.end() + 512 && sector + 512 <= recs.last().unwrap().end());
    write_log(&root, sb, sector, &[0u8; 512]);
    invalidate_checkpoint(&root);
    mark_unclean(&root);
    let root2 = root.clone();
    let kept = recs.clone();
    run(move || async move {
        let store = Store::open(cfg(&root2)).await.expect("a torn tail opens");
        let (at, _) = store.report.truncated.expect("the torn tail is reported");
        assert_eq!(at, victim.log_off, "cut where the damaged record starts");
        let before: Vec<Rec> = kept
            .iter()
            .filter(|r| r.log_off < victim.log_off)
            .cloned()
            .collect();
        check_intact(&store, &before, "records before the hole").await;
        let lost = root2
            .join("lost+found")
            .join(format!("commitlog-{:020}", victim.log_off));
        let saved = std::fs::read(&lost).expect("cut bytes kept in lost+found");
        let last = kept.last().unwrap();
        assert!(saved.len() as u64 >= last.end() - victim.log_off);
        let r = store.put(message("RecA", 0, 999, 100)).await;
        assert_eq!(r.status, PutStatus::PutOk);
        assert_eq!(r.log_offset, victim.log_off, "puts continue at the cut");
        store.shutdown().await.unwrap();
    });
}

/// A lost write (a zeroed page) inside an older segment after a clean stop whose
/// checkpoint is unusable (damaged, or a RocketMQ store root without coremq's
/// section): later segments hold acknowledged records, so this is interior damage,
/// not the end of the data. It must be refused, and no segment may be deleted.
#[test]
fn zeroed_page_inside_the_log_with_unusable_checkpoint_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("s");
    let recs = populate(
        &root,
        messages(&QS, 900, |i| 2000 + (i as usize * 97) % 2000),
    );
    let sb = seg_bytes(&root);
    assert!(recs.last().unwrap().end() > 2 * sb, "want three segments");
    let victim = recs.iter().find(|r| r.log_off > sb / 2).unwrap().clone();
    write_log(&root, sb, victim.log_off, &vec![0u8; 4096]);
    invalidate_checkpoint(&root);
    let segs_before = segments(&root).len();
    let r = expect_refused(
        &root,
        victim.log_off,
        "zeroed page in segment 0, clean stop, no checkpoint",
    );
    let segs_after = segments(&root).len();
    assert!(
        r.is_ok(),
        "{}\n(segments before {segs_before}, after {segs_after}; {} acknowledged records lie after the damage)",
        r.unwrap_err(),
        recs.iter().filter(|x| x.log_off > victim.log_off).count()
    );
}

// ---------------------------------------------------------------------------------
// The refuse line is the durable flushed offset: the flush mark's when it is past the
// checkpoint's (issue 16).

/// Rewrites only the checkpoint's flushed and dispatch offsets (the flush mark stays),
/// as a crash leaves a checkpoint written up to a second before the last flush.
fn lag_checkpoint_only(root: &Path, log_flushed: u64) {
    use coremq::format::checkpoint::Checkpoint;
    let bytes = std::fs::read(root.join("checkpoint")).unwrap();
    let (cp, valid) = Checkpoint::decode(&bytes).unwrap();
    assert!(valid);
    let cp = Checkpoint {
        log_flushed_offset: log_flushed,
        dispatch_safe_offset: log_flushed,
        ..cp
    };
    std::fs::write(root.join("checkpoint"), cp.encode()).unwrap();
}

/// Damage in a record the flush mark covers but the (older) checkpoint does not, with
/// valid records after it in the last pool: it was durable and acknowledged, so open
/// refuses, naming the file and offset, and changes nothing. Both a flip (a fully
/// written record) and a zeroed sector (as a torn write leaves, which the checkpoint's
/// line alone would take for a torn tail).
#[test]
fn damage_below_the_flush_mark_but_above_the_checkpoint_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let pristine = tmp.path().join("pristine");
    let recs = populate(
        &pristine,
        messages(&QS, 60, |i| 700 + (i as usize * 37) % 500),
    );
    let sb = seg_bytes(&pristine);
    let mut failures = Vec::new();
    for (case, zero_sector) in [("flip", false), ("zeroed sector", true)] {
        let root = tmp.path().join(case.replace(' ', "-"));
        copy_dir(&pristine, &root);
        let victim = recs[recs.len() - 5].clone();
        if zero_sector {
            let sector = (victim.log_off / 512 + 1) * 512;
            write_log(&root, sb, sector, &[0u8; 512]);
        } else {
            flip_log_byte(&root, sb, victim.log_off + 88 + 5, 0x01);
        }
        lag_checkpoint_only(&root, recs[recs.len() - 10].log_off);
        mark_unclean(&root);
        if let Err(e) = expect_refused(&root, victim.log_off, case) {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// With a flush mark, damage above it followed by valid records was never acknowledged
/// as durable (async mode: a flush that returned covered only what the mark names),
/// whatever the damage looks like: even a fully written record failing its checksum
/// is a torn tail, cut and kept in `lost+found/`.
#[test]
fn with_a_flush_mark_damage_above_it_before_valid_records_is_cut_and_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("s");
    let recs = populate(&root, messages(&QS, 60, |i| 700 + (i as usize * 37) % 500));
    let sb = seg_bytes(&root);
    let victim = recs[recs.len() - 6].clone();
    flip_log_byte(&root, sb, victim.log_off + 88 + 5, 0x01);
    forge_checkpoint(&root, victim.log_off, victim.log_off);
    mark_unclean(&root);
    let kept = recs.clone();
    run(move || async move {
        let store = Store::open(cfg(&root)).await.expect("a torn tail opens");
        let (at, _) = store.report.truncated.expect("the torn tail is reported");
        assert_eq!(at, victim.log_off, "cut where the damaged record starts");
        let before: Vec<Rec> = kept
            .iter()
            .filter(|r| r.log_off < victim.log_off)
            .cloned()
            .collect();
        check_intact(&store, &before, "records before the damage").await;
        let lost = root
            .join("lost+found")
            .join(format!("commitlog-{:020}", victim.log_off));
        let saved = std::fs::read(&lost).expect("cut bytes kept in lost+found");
        assert_eq!(
            saved.len() as u64,
            kept.last().unwrap().end() - victim.log_off
        );
        store.shutdown().await.unwrap();
    });
}

/// A checkpoint inside a record (a build whose sync rounds could end mid-record), no
/// flush mark, and that record's tail torn past the checkpoint (its framing intact, a
/// body sector zeroed): the record was never wholly durable, so it is a torn tail, cut,
/// not refused.
#[test]
fn a_checkpoint_inside_a_torn_record_cuts_it() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("s");
    let mut msgs = messages(&QS, 30, |i| 100 + (i as usize * 37) % 900);
    msgs.push(message("RecA", 0, 30, 3000));
    let recs = populate(&root, msgs);
    let last = recs.last().unwrap().clone();
    let sb = seg_bytes(&root);
    let sector = (last.log_off / 512 + 3) * 512;
    assert!(sector + 512 < last.end() - 200, "a body sector");
    assert!(sector > last.log_off + 1024, "past the checkpoint");
    write_log(&root, sb, sector, &[0u8; 512]);
    forge_checkpoint(&root, last.log_off + 1024, last.log_off);
    std::fs::remove_file(root.join("flushmark")).unwrap();
    mark_unclean(&root);
    torn_tail_case(
        "checkpoint inside a torn record",
        &root,
        &recs,
        last.log_off,
        None,
    )
    .unwrap();
}

// ---------------------------------------------------------------------------------
// A lost log tail with ConsumeQueues ahead of it (async-flush crash).

/// Async flush: the dispatcher indexes records as soon as they are written, and the
/// queue flusher may put those entries on disk before the records themselves are. A
/// crash then leaves ConsumeQueue entries pointing past the recovered log end, across
/// several ConsumeQueue files. Recovery must cut every queue back to the log.
#[test]
fn lost_log_tail_cuts_consume_queues_back_across_files() {
    let tmp = tempfile::tempdir().unwrap();
    let pristine = tmp.path().join("pristine");
    // One queue, 2500 entries: three 1000-entry ConsumeQueue files.
    let recs = populate(&pristine, messages(&[("Lost", 0)], 2500, |_| 40));
    assert_eq!(recs.last().unwrap().qoff, 2499);
    assert!(
        recs.last().unwrap().end() < seg_bytes(&pristine),
        "one segment"
    );
    let mut failures = Vec::new();
    for cut_q in [2200u64, 1500, 1000, 500] {
        let root = tmp.path().join(format!("cut{cut_q}"));
        copy_dir(&pristine, &root);
        let cut = recs[cut_q as usize].log_off;
        let end = recs.last().unwrap().end();
        write_log(
            &root,
            seg_bytes(&root),
            cut,
            &vec![0u8; (end - cut) as usize],
        );
        // Flushed up to a bit before the cut; dispatched (and queue-flushed) to the end.
        forge_checkpoint(&root, recs[cut_q as usize - 50].log_off, end);
        mark_unclean(&root);
        let kept: Vec<Rec> = recs[..cut_q as usize].to_vec();
        let root2 = root.clone();
        let r = std::thread::spawn(move || {
            run_ret(move || async move {
                let store = Store::open(cfg(&root2))
                    .await
                    .map_err(|e| format!("open: {e}"))?;
                let max = store.max_queue_offset("Lost", 0);
                if max != cut_q {
                    let g = store.get("Lost", 0, cut_q, 1, 1 << 20).await;
                    let r = store.put(message("Lost", 0, 99_999, 40)).await;
                    return Err(format!(
                        "queue max offset {max} but the log ends after queue offset {} \
                         (get({cut_q}) -> {:?}; a new put got queue offset {})",
                        cut_q - 1,
                        g.map(|g| g.status),
                        r.queue_offset
                    ));
                }
                check_intact(&store, &kept[kept.len() - 20..], "kept").await;
                let r = store.put(message("Lost", 0, 99_999, 40)).await;
                assert_eq!((r.queue_offset, r.log_offset), (cut_q, cut));
                store.shutdown().await.unwrap();
                Ok(())
            })
        })
        .join()
        .unwrap_or_else(|p| Err(format!("panicked: {}", panic_text(&p))));
        if let Err(e) = r {
            failures.push(format!("log cut at queue offset {cut_q}: {e}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---------------------------------------------------------------------------------
// ConsumeQueue rebuilds.

fn queue_state(store: &Store) -> Vec<(String, i32, u64, u64)> {
    store
        .queues()
        .into_iter()
        .map(|(t, q)| {
            let (min, max) = (store.min_queue_offset(&t, q), store.max_queue_offset(&t, q));
            (t, q, min, max)
        })
        .collect()
}

/// Reopens after `damage` and expects every queue back as it was, then puts
/// continuing each queue, surviving a restart.
fn expect_rebuilt(root: &Path, recs: &[Rec], expected: Vec<(String, i32, u64, u64)>, what: &str) {
    let root = root.to_path_buf();
    let recs = recs.to_vec();
    let what = what.to_string();
    run(move || async move {
        let store = Store::open(cfg(&root))
            .await
            .unwrap_or_else(|e| panic!("{what}: open: {e}"));
        let got = queue_state(&store);
        assert_eq!(
            got, expected,
            "{what}: queues after reopen (report {:?})",
            store.report
        );
        check_intact(&store, &recs, &what).await;
        let mut more = Vec::new();
        for (t, q, _, max) in &expected {
            let r = store.put(message(t, *q, 50_000, 120)).await;
            assert_eq!(r.status, PutStatus::PutOk);
            assert_eq!(
                r.queue_offset, *max,
                "{what}: {t}/{q} must continue at {max}"
            );
            more.push(Rec {
                topic: t.clone(),
                q: *q,
                qoff: r.queue_offset,
                log_off: r.log_offset,
                size: r.wrote_bytes as u64,
                body: body_for(t, *q, 50_000, 120),
                ts: r.store_timestamp_ms,
            });
        }
        store.wait_dispatched().await;
        store.shutdown().await.unwrap();
        let store = Store::open(cfg(&root)).await.unwrap();
        check_intact(&store, &recs, &format!("{what}, restarted")).await;
        check_intact(&store, &more, &format!("{what}, restarted")).await;
        store.shutdown().await.unwrap();
    });
}

type QueueState = Vec<(String, i32, u64, u64)>;

fn rebuild_fixture(root: &Path) -> (Vec<Rec>, QueueState) {
    let mut qs = QS.to_vec();
    qs.push(("%RETRY%group", 2));
    // RecA/0 gets 1200 entries: two ConsumeQueue files.
    let mut msgs = messages(&qs, 400, |i| 60 + (i as usize * 13) % 500);
    msgs.extend(messages(&[("RecA", 0)], 1100, |_| 30));
    let recs = populate(root, msgs);
    let expected = run_ret({
        let root = root.to_path_buf();
        move || async move {
            let store = Store::open(cfg(&root)).await.unwrap();
            let s = queue_state(&store);
            store.shutdown().await.unwrap();
            s
        }
    });
    assert_eq!(expected.len(), 4);
    assert!(
        expected
            .iter()
            .any(|(t, q, _, max)| t == "RecA" && *q == 0 && *max == 1200)
    );
    (recs, expected)
}

#[test]
fn deleted_consume_queues_are_rebuilt_with_unusable_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("s");
    let (recs, expected) = rebuild_fixture(&root);
    std::fs::remove_dir_all(root.join("consumequeue")).unwrap();
    invalidate_checkpoint(&root);
    expect_rebuilt(
        &root,
        &recs,
        expected,
        "consumequeue/ deleted, checkpoint zeroed",
    );
}

/// The harder case: the checkpoint is valid and says every queue entry is on disk, so
/// the store must notice by itself that the queues are gone.
#[test]
fn deleted_consume_queues_are_rebuilt_with_valid_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("s");
    let (recs, expected) = rebuild_fixture(&root);
    let cp = read_checkpoint(&root).expect("valid checkpoint after clean stop");
    std::fs::remove_dir_all(root.join("consumequeue")).unwrap();
    assert!(read_checkpoint(&root) == Some(cp));
    expect_rebuilt(
        &root,
        &recs,
        expected,
        "consumequeue/ deleted, checkpoint valid",
    );
}

#[test]
fn one_deleted_queue_directory_is_rebuilt_with_valid_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("s");
    let (recs, expected) = rebuild_fixture(&root);
    std::fs::remove_dir_all(root.join("consumequeue").join("RecB").join("0")).unwrap();
    expect_rebuilt(
        &root,
        &recs,
        expected,
        "consumequeue/RecB/0 deleted, checkpoint valid",
    );
}

/// Unclean stop with a checkpoint whose dispatch point lags the log, and the queues
/// gone: the rebuild must start at the first record, not at the checkpoint (which
/// would make each queue start late, losing its first entries).
#[test]
fn deleted_consume_queues_are_rebuilt_after_a_crash_with_lagging_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("s");
    let (recs, expected) = rebuild_fixture(&root);
    let mid = recs[recs.len() / 2].log_off;
    forge_checkpoint(&root, recs.last().unwrap().end(), mid);
    mark_unclean(&root);
    std::fs::remove_dir_all(root.join("consumequeue")).unwrap();
    expect_rebuilt(
        &root,
        &recs,
        expected,
        "consumequeue/ deleted after a crash, dispatch point mid-log",
    );
}

/// Only the second file of a two-file queue is gone (the queue directory and its
/// first, full file remain). The queue count is unchanged, so only the log can tell.
#[test]
fn deleted_last_consume_queue_file_is_rebuilt_with_valid_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("s");
    let (recs, expected) = rebuild_fixture(&root);
    let second = root
        .join("consumequeue")
        .join("RecA")
        .join("0")
        .join(format!("{:020}", 1000 * 20));
    assert!(
        second.exists(),
        "RecA/0 should have a second ConsumeQueue file"
    );
    std::fs::remove_file(&second).unwrap();
    expect_rebuilt(
        &root,
        &recs,
        expected,
        "last ConsumeQueue file of RecA/0 deleted, checkpoint valid",
    );
}

// ---------------------------------------------------------------------------------
// The directory lock.

const LOCK_CHILD_ENV: &str = "COREMQ_LOCK_CHILD";

/// Acts as the lock-probe child only when `COREMQ_LOCK_CHILD=<dir>` is set: tries to
/// open the store and prints what happened.
#[test]
fn lock_probe_child() {
    let Some(root) = std::env::var_os(LOCK_CHILD_ENV) else {
        return;
    };
    let root = PathBuf::from(root);
    run(move || async move {
        match Store::open(cfg(&root)).await {
            Ok(store) => {
                store.shutdown().await.unwrap();
                println!("LOCK-PROBE: opened");
            }
            Err(Error::Locked(p)) => println!("LOCK-PROBE: locked {}", p.display()),
            Err(e) => println!("LOCK-PROBE: error {e}"),
        }
    });
}

fn probe_from_child(root: &Path, log: &Path) -> String {
    let envs: Vec<(&str, OsString)> = vec![(LOCK_CHILD_ENV, root.into())];
    let mut child = spawn_self("lock_probe_child", &envs, log);
    let status = child.wait().unwrap();
    let out = std::fs::read_to_string(log).unwrap();
    assert!(
        status.success(),
        "lock probe child failed ({status}):\n{out}"
    );
    out.lines()
        .find_map(|l| l.split("LOCK-PROBE: ").nth(1))
        .unwrap_or_else(|| panic!("no probe line in:\n{out}"))
        .to_string()
}

#[test]
fn second_open_is_locked_from_another_executor_and_another_process() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("s");
    let log = tmp.path().join("child.log");
    let root2 = root.clone();
    let log2 = log.clone();
    run(move || async move {
        let store = Store::open(cfg(&root2)).await.unwrap();
        let recs = put_all(&store, messages(&QS, 6, |_| 100)).await;
        // Another executor thread in this process.
        let r3 = root2.clone();
        let other = std::thread::spawn(move || {
            run_ret(move || async move {
                match Store::open(cfg(&r3)).await {
                    Err(Error::Locked(p)) => Ok(p),
                    Err(e) => Err(format!("expected Error::Locked, got {e:?}")),
                    Ok(s) => {
                        s.shutdown().await.ok();
                        Err("a second Store opened the same directory".to_string())
                    }
                }
            })
        })
        .join()
        .unwrap();
        assert_eq!(other.unwrap(), root2, "Locked names the directory");
        // Another process.
        let probe = probe_from_child(&root2, &log2);
        assert!(probe.starts_with("locked"), "child process: {probe}");
        // The first store is unharmed.
        let r = store.put(message("RecA", 0, 100, 100)).await;
        assert_eq!(r.status, PutStatus::PutOk);
        store.wait_dispatched().await;
        check_intact(&store, &recs, "after lock probes").await;
        store.shutdown().await.unwrap();
        // Released by shutdown: both can open now.
        assert_eq!(probe_from_child(&root2, &log2), "opened");
    });
    try_open(&root).expect("open after the child released the lock");
}

/// `shutdown` documents "release the lock"; a clone of the handle still alive (a
/// task that has not finished, a cache) must not keep the directory locked.
#[test]
fn shutdown_releases_the_lock_while_a_clone_is_alive() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("s");
    let root2 = root.clone();
    run(move || async move {
        let store = Store::open(cfg(&root2)).await.unwrap();
        let recs = put_all(&store, messages(&QS, 6, |_| 100)).await;
        let clone = store.clone();
        store.shutdown().await.unwrap();
        assert!(!root2.join("abort").exists());
        let again = Store::open(cfg(&root2)).await;
        let again =
            again.unwrap_or_else(|e| panic!("reopen after shutdown with a live clone: {e}"));
        check_intact(&again, &recs, "reopened").await;
        again.shutdown().await.unwrap();
        drop(clone);
    });
}

/// A store dropped without `shutdown` (an error path, a panic unwinding) is an
/// unclean stop; once its executor is gone, the directory must be usable again in
/// the same process and recovery must find everything acknowledged.
#[test]
fn dropped_store_releases_the_lock_and_recovers() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("s");
    let root2 = root.clone();
    let recs = run_ret(move || async move {
        let store = Store::open(cfg(&root2)).await.unwrap();
        let recs = put_all(&store, messages(&QS, 30, |i| 100 + i as usize)).await;
        drop(store);
        recs
    });
    assert!(root.join("abort").exists());
    run(move || async move {
        let store = Store::open(cfg(&root)).await.unwrap_or_else(|e| {
            panic!("reopen after dropping the store (its executor has exited): {e}")
        });
        assert!(!store.report.clean_shutdown);
        check_intact(&store, &recs, "after drop").await;
        store.shutdown().await.unwrap();
    });
}

// ---------------------------------------------------------------------------------
// What a restart must keep.

#[derive(Debug, PartialEq)]
struct Answers {
    queues: Vec<(String, i32, u64, u64)>,
    max_log: u64,
    min_log: u64,
    earliest: Vec<i64>,
    by_time: Vec<u64>,
}

async fn answers(store: &Store, probes: &[i64]) -> Answers {
    let mut qs: Vec<(String, i32)> = store.queues();
    qs.push(("NoSuchTopic".into(), 0));
    qs.push(("RecA".into(), 7));
    let mut earliest = Vec::new();
    let mut by_time = Vec::new();
    for (t, q) in &qs {
        earliest.push(store.earliest_message_time(t, *q).await.unwrap());
        for p in probes {
            by_time.push(store.queue_offset_by_time(t, *q, *p).await.unwrap());
        }
    }
    Answers {
        queues: queue_state(store),
        max_log: store.max_log_offset(),
        min_log: store.min_log_offset(),
        earliest,
        by_time,
    }
}

#[test]
fn restart_keeps_offsets_and_time_answers() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("s");
    let root2 = root.clone();
    run(move || async move {
        let root = root2;
        let store = Store::open(cfg(&root)).await.unwrap();
        let mut recs = Vec::new();
        for round in 0..4u64 {
            let msgs = messages(&QS, 30, |i| 80 + (i as usize * 7) % 300)
                .into_iter()
                .map(|mut m| {
                    m.body = format!("round {round} ")
                        .into_bytes()
                        .into_iter()
                        .chain(m.body.iter().copied())
                        .collect::<Vec<u8>>()
                        .into();
                    m
                })
                .collect();
            recs.extend(put_all(&store, msgs).await);
            glommio::timer::sleep(Duration::from_millis(30)).await;
        }
        let mut probes: Vec<i64> = vec![0, i64::MIN, i64::MAX];
        for r in &recs {
            probes.extend([r.ts - 1, r.ts, r.ts + 1]);
        }
        probes.sort();
        probes.dedup();
        // The answers agree with what the puts reported.
        for (t, q) in QS {
            let mine: Vec<&Rec> = recs.iter().filter(|r| r.topic == t && r.q == q).collect();
            assert_eq!(store.earliest_message_time(t, q).await.unwrap(), mine[0].ts);
            for p in &probes {
                let want = mine.iter().position(|r| r.ts >= *p).unwrap_or(mine.len()) as u64;
                assert_eq!(
                    store.queue_offset_by_time(t, q, *p).await.unwrap(),
                    want,
                    "{t}/{q} by time {p}"
                );
            }
        }
        assert_eq!(
            store.earliest_message_time("NoSuchTopic", 0).await.unwrap(),
            -1
        );
        let before = answers(&store, &probes).await;
        store.shutdown().await.unwrap();

        let store = Store::open(cfg(&root)).await.unwrap();
        assert!(store.report.clean_shutdown);
        assert_eq!(
            store.report.entries_rebuilt, 0,
            "a clean restart rebuilds nothing"
        );
        let after = answers(&store, &probes).await;
        assert_eq!(after, before, "clean restart changed answers");
        assert_eq!(store.flushed_log_offset(), before.max_log);
        assert_eq!(store.dispatched_log_offset(), before.max_log);
        check_intact(&store, &recs, "clean restart").await;
        store.shutdown().await.unwrap();

        // The same after an unclean stop with nothing trusted.
        mark_unclean(&root);
        invalidate_checkpoint(&root);
        let store = Store::open(cfg(&root)).await.unwrap();
        assert!(!store.report.clean_shutdown);
        let after = answers(&store, &probes).await;
        assert_eq!(after, before, "full-rescan restart changed answers");
        // Store timestamps never go backwards across a restart.
        let r = store.put(message("RecA", 0, 999, 50)).await;
        assert!(r.store_timestamp_ms >= recs.iter().map(|r| r.ts).max().unwrap());
        assert_eq!(
            r.queue_offset,
            before
                .queues
                .iter()
                .find(|x| x.0 == "RecA" && x.1 == 0)
                .unwrap()
                .3
        );
        store.shutdown().await.unwrap();
    });
}

// ---------------------------------------------------------------------------------
// Sync mode's prewritten (zero-filled) log tail.

/// Waits (at most 20 s) until the first segment, `seg` bytes, holds data at or past
/// `from` (`SEEK_DATA`), and returns where it starts.
async fn first_data_past(root: &Path, from: u64, seg: u64) -> u64 {
    let path = root.join("commitlog").join(coremq::io::offset_name(0));
    let t0 = std::time::Instant::now();
    loop {
        match coremq::io::next_data(&path, from).unwrap() {
            Some(d) if d < seg => return d,
            _ => {
                assert!(t0.elapsed() < Duration::from_secs(20), "nothing prewritten");
                glommio::timer::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// The prewriter fills from the first page past the log's end, in a new log too, so
/// no sync round writes into a hole (an allocating write, whose durable write also
/// writes the file's inode). It fails when the prewrite starts a chunk past the end,
/// as a first version did: a new log's first chunk stayed sparse.
#[test]
fn a_new_log_is_prewritten_from_the_page_past_its_end() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("s");
    let seg = seg_bytes(&root);
    run(move || async move {
        let store = Store::open(cfg(&root)).await.unwrap();
        let recs = put_all(&store, messages(&QS, 5, |_| 200)).await;
        let next_page = coremq::io::align_up(recs.last().unwrap().end());
        assert_eq!(
            first_data_past(&root, next_page, seg).await,
            next_page,
            "the blocks right past the log's end are written (zero-filled), not a hole"
        );
        store.shutdown().await.unwrap();
    });
}

/// With `sync_flush_lead_when_idle`, sync puts made one at a time by a task on the
/// shard are written by the shard itself (`sync_rounds_led` counts the rounds), each
/// durable when its put returns; without it the group-commit thread writes every round.
/// Either way every record is there after the reopen.
#[test]
fn an_idle_shard_leads_its_sync_rounds_only_when_asked() {
    for lead in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("s");
        run(move || async move {
            let mut c = cfg(&root);
            c.sync_flush_lead_when_idle = lead;
            let store = Store::open(c.clone()).await.unwrap();
            let recs = put_all(&store, messages(&QS, 60, |i| 100 + i as usize * 13)).await;
            let led = store.stats().sync_rounds_led;
            if lead {
                assert!(led > 0 && led <= 60, "lead on: {led} rounds led");
            } else {
                assert_eq!(led, 0, "lead off");
            }
            store.shutdown().await.unwrap();
            let store = Store::open(c).await.unwrap();
            check_intact(&store, &recs, "after the reopen").await;
            store.shutdown().await.unwrap();
        });
    }
}

/// Sync flush zero-fills the log ahead of the write position (`commit_log_prewrite_bytes`)
/// so flushes land in written blocks. The zero tail must read as the end of the log
/// after an unclean stop and after a clean one (nothing cut, nothing lost), puts must
/// continue exactly there, and the prewriter must never have zeroed a record.
#[test]
fn prewritten_zero_tail_is_the_end_of_the_log() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("s");
    let seg = seg_bytes(&root);
    let root2 = root.clone();
    let recs = run_ret(move || async move {
        let c = cfg(&root2);
        assert!(c.prewrite_bytes() > 0, "sync flush prewrites by default");
        let store = Store::open(c).await.unwrap();
        let recs = put_all(
            &store,
            messages(&QS, 300, |i| 100 + (i as usize * 37) % 900),
        )
        .await;
        let end = recs.last().unwrap().end();
        assert!(
            end < seg / 2,
            "the test wants the prewrite inside the first segment"
        );
        // Wait for the prewriter to have written blocks past the end.
        first_data_past(&root2, coremq::io::align_up(end) + 4096, seg).await;
        drop(store);
        recs
    });
    let end = recs.last().unwrap().end();
    let file = std::fs::read(root.join("commitlog").join(coremq::io::offset_name(0))).unwrap();
    assert!(
        file[end as usize..].iter().all(|b| *b == 0),
        "only zeros past the end"
    );
    let root2 = root.clone();
    let recs = run_ret(move || async move {
        let store = Store::open(cfg(&root2)).await.unwrap();
        assert!(!store.report.clean_shutdown);
        assert_eq!(
            store.report.log_end, end,
            "unclean stop: the zero tail is the end"
        );
        assert_eq!(store.report.truncated, None, "nothing to cut");
        check_intact(&store, &recs, "after unclean stop").await;
        let more = put_all(&store, messages(&QS, 20, |i| 300 + i as usize)).await;
        assert_eq!(more[0].log_off, end, "puts continue at the end");
        store.shutdown().await.unwrap();
        recs.into_iter().chain(more).collect::<Vec<_>>()
    });
    let end = recs.last().unwrap().end();
    run(move || async move {
        let store = Store::open(cfg(&root)).await.unwrap();
        assert!(store.report.clean_shutdown);
        assert_eq!(
            store.report.log_end, end,
            "clean stop: the zero tail is the end"
        );
        check_intact(&store, &recs, "after clean stop").await;
        store.shutdown().await.unwrap();
    });
}
