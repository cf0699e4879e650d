//! The process crash loop (issue 6, reliability harness): kill -9 a sharded writer
//! over and over on one growing store and check every acknowledged put each time.
//!
//! Every cycle:
//!
//! 1. One writer child (sometimes two in a row) re-runs this test binary as
//!    `crash_loop_child` (active only when `COREMQ_LOOP_CHILD=<store dir>` is set). It
//!    opens a 3-shard [`ShardedStore`] with `FlushMode::Sync` and puts from outside
//!    threads (single puts and `put_batch` across queues and shards) and from a task on
//!    every shard (`run_on`), over 3 topics x 4 queues, with varied body sizes. Each
//!    message carries a unique key (first word of its `KEYS`) from which its body and
//!    tags are derived, so any record in the store can be checked byte for byte. After
//!    every `PutOk` (and only then) the child appends one line per message (topic,
//!    queue, queue offset, commit-log offset, message id, keys, body length, body
//!    hash) to its ack log with a single `write(2)`: the page cache survives SIGKILL,
//!    so no fsync is needed, and a kill can cut at most the last line (ignored).
//! 2. The parent SIGKILLs the child at a seeded random moment: 30% of the time
//!    0-400 ms after the spawn, opened or not (often while it is still starting or
//!    recovering the store), otherwise 0-400 ms after it reports the store open
//!    (mid-load; 0-100 ms for a cycle's second writer). A writer that does not open
//!    the store within 60 s fails the run (recovery hang).
//! 3. The parent reopens the store in-process (on a watchdog thread: recovery over
//!    60 s fails the run) and checks: every queue is contiguous from offset 0; every
//!    record decodes and is what the workload wrote for its key; every message seen
//!    in earlier cycles is still there, identical, at its queue offset with its
//!    commit-log offset; every acknowledged message is there, identical (topic, queue,
//!    queue offset, log offset, message id, keys, body); new messages and a sample of
//!    older ones are found by `look_by_msg_id` and by `query_by_key` (exactly one hit).
//!    It shuts the store down and runs `coremq inspect check DIR` (records, every
//!    ConsumeQueue entry against its record, every record has an entry, checkpoint).
//!    With `COREMQ_CRASH_FULL_EVERY=N` (N > 1, for long runs: a whole-store check
//!    costs time in proportion to the store, so a run of N cycles would cost N^2)
//!    only every N-th cycle and the last check everything that way; the others read
//!    each queue from `TAIL` entries before where it ended at the last check (so
//!    every acknowledgement of the cycle and every cut of a tail is checked), check
//!    `SAMPLES` random older entries per queue against what was seen, do the same
//!    lookups, and skip `inspect check`.
//!    At random it then leaves the shards' `abort` files, so the next child recovers
//!    as after a crash.
//!
//! Counts: `acked` (distinct acknowledged messages), `verified` (acknowledged
//! messages that passed every check the last time they were checked), `lost`
//! (acknowledged but missing, different, or not findable by id or key), `corrupt`
//! (the store refused to open, recovery hung, shutdown failed, `inspect check`
//! failed, a record came back different or undecodable, a record seen by an earlier
//! cycle vanished, or open + shutdown left files open in the verifying process). The run stops at the first cycle with a failure and keeps
//! the store directory (its path is printed). The last line printed is
//! `cycles=N acked=A verified=V lost=L corrupt=C seed=S`.
//!
//! Knobs (environment):
//! * `COREMQ_CRASH_CYCLES` (default 8), `COREMQ_CRASH_SEED` (default: from the
//!   clock; always printed, so a failure can be replayed, within timing);
//! * `COREMQ_CRASH_DIR`: where to make the work directory (default: the temp dir);
//! * `COREMQ_CRASH_FULL_EVERY` (default 1): a whole-store check every N cycles (above);
//! * `COREMQ_CRASH_SYNC_LEAD` (set: on): the store's `sync_flush_lead_when_idle`;
//! * `COREMQ_TEST_LOG`: the store's tracing output (children's go to their logs).
//!
//! ```sh
//! cargo test --test crash_loop -- --nocapture                       # 8 cycles
//! COREMQ_CRASH_CYCLES=50 COREMQ_CRASH_SEED=42 cargo test --release --test crash_loop -- --nocapture
//! scripts/crash.sh --cycles 200 [--seed S]                          # release build
//! ```
#[path = "common/child.rs"]
mod child;

use child::*;
use coremq::StoreOps;
use coremq::{
    Error, FlushMode, GetStatus, Handle, Message, PutResult, PutStatus, ShardedConfig,
    ShardedStore, StoreConfig, StoredMessage,
};
use futures_lite::future::block_on;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "COREMQ_LOOP_CHILD";
const ACKS_ENV: &str = "COREMQ_LOOP_ACKS";
const OPENED_ENV: &str = "COREMQ_LOOP_OPENED";
const CHILD_SEED_ENV: &str = "COREMQ_LOOP_CHILD_SEED";
const PREFIX_ENV: &str = "COREMQ_LOOP_KEY_PREFIX";

const SHARDS: usize = 3;
const TOPICS: [&str; 3] = ["LoopA", "LoopB", "%RETRY%loop-group"];
const QUEUES: i32 = 4;
/// Outside threads doing single puts (one more does batches).
const PUT_THREADS: usize = 3;
/// Recovery (opening the store) longer than this fails the run.
const OPEN_TIMEOUT: Duration = Duration::from_secs(60);
/// The whole verification of a cycle longer than this fails the run.
const VERIFY_TIMEOUT: Duration = Duration::from_secs(600);
/// Older messages re-checked by id and key each cycle (all of them while fewer).
const OLD_LOOKUPS: usize = 200;
/// Threads issuing lookups in the verifier.
const LOOKUP_THREADS: usize = 4;
/// A partial check reads each queue from this many entries before its last end.
const TAIL: u64 = 256;
/// A partial check compares this many random older entries of each queue.
const SAMPLES: usize = 16;

fn config(root: &Path) -> ShardedConfig {
    let mut cfg = ShardedConfig::new(root);
    cfg.shards = SHARDS;
    // Two CPUs shared with other work: let the kernel place the shard threads.
    cfg.pin = false;
    cfg.store = StoreConfig::small_for_tests(root);
    cfg.store.flush_mode = FlushMode::Sync;
    // `scripts/crash.sh --sync-lead`: shards write their rounds themselves when idle.
    cfg.store.sync_flush_lead_when_idle = std::env::var_os("COREMQ_CRASH_SYNC_LEAD").is_some();
    cfg
}

fn all_queues() -> Vec<(&'static str, i32)> {
    TOPICS
        .iter()
        .flat_map(|t| (0..QUEUES).map(move |q| (*t, q)))
        .collect()
}

/// The body the workload writes for `key`: `len` bytes seeded by the key.
fn body_of(key: &str, len: usize) -> Vec<u8> {
    let mut rng = Rng::new(fnv1a(key.as_bytes()));
    let mut b = vec![0u8; len];
    rng.fill(&mut b);
    b
}

fn tags_of(key: &str) -> String {
    format!("t{}", fnv1a(key.as_bytes()) % 3)
}

/// Mostly small bodies, some tens of KiB, a few empty, rarely the largest allowed,
/// so records straddle write windows, pages and segment ends.
fn body_len(rng: &mut Rng, max: usize) -> usize {
    match rng.range(0, 999) {
        0..=2 => max,
        3..=30 => rng.range(10_000, 60_000) as usize,
        31..=45 => 0,
        _ => rng.range(1, 3_000) as usize,
    }
}

/// A workload message: unique key `key`, plus a key shared by its writer.
fn make_message(topic: &str, q: i32, key: &str, writer: &str, rng: &mut Rng) -> Message {
    let len = body_len(rng, StoreConfig::small_for_tests("/").max_message_bytes);
    Message::new(topic, q, body_of(key, len))
        .with_tags(tags_of(key))
        .with_keys(format!("{key} {writer}"))
}

// ---------------------------------------------------------------------------------
// The writer child.

type AckLog = Arc<Mutex<std::fs::File>>;

/// Appends one ack line per acknowledged message, in one write.
fn record_acks(log: &AckLog, msgs: &[Message], results: &[PutResult]) {
    let mut lines = String::new();
    for (m, r) in msgs.iter().zip(results) {
        if r.status != PutStatus::PutOk {
            eprintln!(
                "{}/{}: put status {:?} (not acknowledged)",
                m.topic, m.queue_id, r.status
            );
            continue;
        }
        assert_eq!(r.msg_ids.len(), 1, "one message id per message");
        assert_eq!(r.msg_ids[0].offset, r.log_offset);
        lines.push_str(&format!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{:016x}\n",
            m.topic,
            m.queue_id,
            r.queue_offset,
            r.log_offset,
            r.msg_ids[0],
            m.property("KEYS").unwrap_or(""),
            m.body.len(),
            fnv1a(&m.body)
        ));
    }
    if !lines.is_empty() {
        log.lock()
            .unwrap()
            .write_all(lines.as_bytes())
            .expect("write ack log");
    }
}

/// Acts as the writer child only when `COREMQ_LOOP_CHILD` is set; otherwise a no-op.
#[test]
fn crash_loop_child() {
    let Some(root) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let root = PathBuf::from(root);
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} not set"));
    let acks = PathBuf::from(var(ACKS_ENV));
    let opened = PathBuf::from(var(OPENED_ENV));
    let seed: u64 = var(CHILD_SEED_ENV).parse().expect("child seed");
    let prefix = var(PREFIX_ENV);
    if std::env::var_os("COREMQ_TEST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .try_init();
    }
    let started = Instant::now();
    let store = match ShardedStore::open(config(&root)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("CHILD OPEN FAILED: {e}");
            std::process::exit(2);
        }
    };
    let open_ms = started.elapsed().as_millis();
    eprintln!("child {prefix}: open in {open_ms} ms");
    let log: AckLog = Arc::new(Mutex::new(
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&acks)
            .expect("open ack log"),
    ));
    std::fs::write(&opened, open_ms.to_string()).expect("write opened marker");
    let h = store.handle();
    let queues = all_queues();
    let mut threads = Vec::new();
    for w in 0..PUT_THREADS {
        let (h, log, queues, prefix) = (h.clone(), log.clone(), queues.clone(), prefix.clone());
        let mut rng = Rng::new(seed.wrapping_add(w as u64 * 0x1000_0001));
        threads.push(std::thread::spawn(move || {
            let writer = format!("{prefix}p{w}");
            for n in 0u64.. {
                let (t, q) = queues[rng.range(0, queues.len() as u64 - 1) as usize];
                let m = make_message(t, q, &format!("{writer}n{n}"), &writer, &mut rng);
                let r = block_on(h.put(m.clone()));
                record_acks(&log, &[m], &[r]);
            }
        }));
    }
    {
        // Batches of 1..=6 messages over one queue or several (then across shards).
        let (h, log, queues, prefix) = (h.clone(), log.clone(), queues.clone(), prefix.clone());
        let mut rng = Rng::new(seed ^ 0xba7c4);
        threads.push(std::thread::spawn(move || {
            let writer = format!("{prefix}b");
            let mut n = 0u64;
            loop {
                let one_queue = rng.range(0, 1) == 0;
                let count = rng.range(1, 6);
                let mut pick = || queues[rng.range(0, queues.len() as u64 - 1) as usize];
                let first = pick();
                let targets: Vec<_> = (0..count)
                    .map(|_| if one_queue { first } else { pick() })
                    .collect();
                let msgs: Vec<Message> = targets
                    .into_iter()
                    .map(|(t, q)| {
                        n += 1;
                        make_message(t, q, &format!("{writer}n{n}"), &writer, &mut rng)
                    })
                    .collect();
                let rs = block_on(h.put_batch(msgs.clone()));
                record_acks(&log, &msgs, &rs);
            }
        }));
    }
    for shard in 0..SHARDS {
        // A task on the shard putting to its own queues with no hop (to any queue when
        // it owns none, routed by the context).
        let (h2, log, prefix) = (h.clone(), log.clone(), prefix.clone());
        let owned: Vec<(&'static str, i32)> = queues
            .iter()
            .copied()
            .filter(|(t, q)| h.shard_of(t, *q) == shard)
            .collect();
        let owned = if owned.is_empty() {
            queues.clone()
        } else {
            owned
        };
        let mut rng = Rng::new(seed ^ (0x5a5a_0000 + shard as u64));
        threads.push(std::thread::spawn(move || {
            let job = h2.run_on(shard, move |ctx| async move {
                let writer = format!("{prefix}s{shard}");
                for n in 0u64.. {
                    let (t, q) = owned[rng.range(0, owned.len() as u64 - 1) as usize];
                    let m = make_message(t, q, &format!("{writer}n{n}"), &writer, &mut rng);
                    let r = ctx.put(m.clone()).await;
                    record_acks(&log, &[m], &[r]);
                }
            });
            let _ = block_on(job);
        }));
    }
    // Safety net: never outlive a parent that died without killing us.
    std::thread::sleep(Duration::from_secs(60));
    eprintln!("child {prefix}: not killed within 60 s; exiting");
    std::process::exit(3);
}

// ---------------------------------------------------------------------------------
// The parent: what was acknowledged, what the store holds.

/// What identifies a stored message for the checks.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rec {
    log_offset: u64,
    msg_id: String,
    keys: String,
    len: usize,
    hash: u64,
}

impl Rec {
    fn of(m: &StoredMessage) -> Rec {
        Rec {
            log_offset: m.log_offset,
            msg_id: m.msg_id.map(|id| id.to_string()).unwrap_or_default(),
            keys: m.property("KEYS").unwrap_or("").to_string(),
            len: m.body.len(),
            hash: fnv1a(&m.body),
        }
    }

    fn uniq_key(&self) -> &str {
        self.keys.split(' ').next().unwrap_or("")
    }
}

type QueueKey = (String, i32);
/// Acknowledged in this cycle: (topic, queue, queue offset) -> what was acknowledged.
type Acks = BTreeMap<(String, i32, u64), Rec>;

/// A message the store held at the last verification.
#[derive(Debug, Clone)]
struct Known {
    rec: Rec,
    acked: bool,
}

/// Every queue's messages by queue offset, as of the last verification.
type State = BTreeMap<QueueKey, Vec<Known>>;

/// Reads the complete lines of an ack log (a kill may leave half a line at the end).
fn read_acks(path: &Path) -> Vec<((String, i32, u64), Rec)> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let complete = text.rfind('\n').map_or("", |i| &text[..=i]);
    complete
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            assert_eq!(f.len(), 8, "bad ack line {l:?} in {}", path.display());
            let num = |s: &str| {
                s.parse::<u64>()
                    .unwrap_or_else(|_| panic!("bad ack line {l:?}"))
            };
            (
                (f[0].to_string(), f[1].parse().unwrap(), num(f[2])),
                Rec {
                    log_offset: num(f[3]),
                    msg_id: f[4].to_string(),
                    keys: f[5].to_string(),
                    len: num(f[6]) as usize,
                    hash: u64::from_str_radix(f[7], 16).unwrap(),
                },
            )
        })
        .collect()
}

#[derive(Debug, Default, Clone)]
struct Stats {
    cycles: usize,
    children: usize,
    /// Children killed before they had opened the store.
    early_kills: usize,
    acked: usize,
    verified: usize,
    lost: usize,
    corrupt: usize,
    /// Cycles that checked the whole store (and ran `inspect check`).
    full_checks: usize,
}

/// What one verification found.
#[derive(Default)]
struct Verdict {
    /// `None` when the store could not be read (open failed).
    state: Option<State>,
    failures: Vec<String>,
    /// Unique keys of acknowledged messages that failed a check.
    lost: BTreeSet<String>,
    corrupt: usize,
    lookups: usize,
    open_ms: u128,
}

impl Verdict {
    fn fail(&mut self, corrupt: bool, lost_key: Option<&str>, why: String) {
        if self.failures.len() < 50 {
            self.failures.push(why);
        }
        if corrupt {
            self.corrupt += 1;
        }
        if let Some(k) = lost_key {
            self.lost.insert(k.to_string());
        }
    }
}

/// Reads a queue from `from` to its end through the handle (at most `limit`
/// records); stops at the first undecodable record.
fn read_queue(
    h: &Handle,
    t: &str,
    q: i32,
    from: u64,
    limit: usize,
    v: &mut Verdict,
) -> Vec<StoredMessage> {
    let mut out = Vec::new();
    let mut off = from;
    while out.len() < limit {
        let r = match block_on(h.get(t, q, off, 32, 1 << 20)) {
            Ok(r) => r,
            Err(e) => {
                v.fail(true, None, format!("{t}/{q}: get at {off} failed: {e}"));
                return out;
            }
        };
        match r.status {
            GetStatus::Found => {
                for raw in &r.records {
                    match StoredMessage::decode(raw) {
                        Ok(m) => out.push(m),
                        Err(e) => {
                            v.fail(
                                true,
                                None,
                                format!(
                                    "{t}/{q}: record at queue offset {off}+ does not decode: {e}"
                                ),
                            );
                            return out;
                        }
                    }
                }
                if r.next_begin_offset != off + r.records.len() as u64 {
                    v.fail(
                        true,
                        None,
                        format!(
                            "{t}/{q}: get at {off} returned {} records but next_begin_offset {}",
                            r.records.len(),
                            r.next_begin_offset
                        ),
                    );
                    return out;
                }
                off = r.next_begin_offset;
            }
            GetStatus::OffsetOverflowOne
            | GetStatus::NoMessageInQueue
            | GetStatus::NoMatchedLogicQueue => return out,
            s => {
                v.fail(
                    true,
                    None,
                    format!(
                        "{t}/{q}: get at {off} answered {s:?} (min {}, max {})",
                        r.min_offset, r.max_offset
                    ),
                );
                return out;
            }
        }
    }
    out.truncate(limit);
    out
}

/// Compares what the store holds with what earlier cycles saw and what this cycle's
/// children acknowledged; returns the new state. `full`: every entry of every queue;
/// else from `TAIL` before each queue's last end, and `SAMPLES` older ones.
fn compare(
    h: &Handle,
    prev: &State,
    acks: &mut Acks,
    full: bool,
    rng: &mut Rng,
    v: &mut Verdict,
) -> State {
    let mut next = State::new();
    for (t, q) in all_queues() {
        let key = (t.to_string(), q);
        let known: &[Known] = prev.get(&key).map_or(&[], |k| k.as_slice());
        let start = if full {
            0
        } else {
            (known.len() as u64).saturating_sub(TAIL)
        };
        if start > 0 {
            for _ in 0..SAMPLES {
                let i = rng.range(0, start - 1);
                let k = &known[i as usize];
                let got = read_queue(h, t, q, i, 1, v);
                let rec = got.first().map(Rec::of);
                if rec.as_ref() != Some(&k.rec) {
                    v.fail(
                        true,
                        k.acked.then_some(k.rec.uniq_key()),
                        format!(
                            "{t}/{q} queue offset {i} (sampled): was {:?} at the last verification, now {rec:?}",
                            k.rec
                        ),
                    );
                }
            }
        }
        let found = read_queue(h, t, q, start, usize::MAX, v);
        let mut now: Vec<Known> = known[..start as usize].to_vec();
        now.reserve(found.len());
        for (idx, m) in found.iter().enumerate() {
            let i = start + idx as u64;
            let rec = Rec::of(m);
            let at = format!(
                "{t}/{q} queue offset {i} (log offset {}, keys {:?})",
                m.log_offset, rec.keys
            );
            if (m.topic.as_str(), m.queue_id, m.queue_offset) != (t, q, i) {
                v.fail(
                    true,
                    None,
                    format!(
                        "{at}: the entry points at a record of {}/{} queue offset {}",
                        m.topic, m.queue_id, m.queue_offset
                    ),
                );
            }
            let uniq = rec.uniq_key().to_string();
            if m.body[..] != body_of(&uniq, m.body.len())[..]
                || m.property("TAGS") != Some(tags_of(&uniq).as_str())
            {
                v.fail(
                    true,
                    None,
                    format!("{at}: body or tags are not what the workload wrote for that key"),
                );
            }
            let mut acked = false;
            if let Some(k) = known.get(i as usize) {
                acked = k.acked;
                if k.rec != rec {
                    let lost = k.acked.then_some(k.rec.uniq_key());
                    v.fail(
                        true,
                        lost,
                        format!(
                            "{at}: was {:?} at the last verification, now {rec:?}",
                            k.rec
                        ),
                    );
                }
            }
            if let Some(a) = acks.remove(&(t.to_string(), q, i)) {
                acked = true;
                if a != rec {
                    v.fail(
                        true,
                        Some(a.uniq_key()),
                        format!("{at}: acknowledged as {a:?}, the store holds {rec:?}"),
                    );
                }
            }
            now.push(Known { rec, acked });
        }
        for (i, k) in known.iter().enumerate().skip(start as usize + found.len()) {
            let what = if k.acked {
                "acknowledged"
            } else {
                "unacknowledged"
            };
            v.fail(
                true,
                k.acked.then_some(k.rec.uniq_key()),
                format!(
                    "{t}/{q} queue offset {i}: {what} message {:?} was there at the last verification and is gone (queue ends at {})",
                    k.rec,
                    start as usize + found.len()
                ),
            );
        }
        next.insert(key, now);
    }
    for ((t, q, i), a) in std::mem::take(acks) {
        v.fail(
            false,
            Some(a.uniq_key()),
            format!("{t}/{q} queue offset {i}: acknowledged message {a:?} is missing"),
        );
    }
    next
}

/// Checks `look_by_msg_id` and `query_by_key` for messages new since `prev` and for
/// a sample of older ones.
fn lookups(h: &Handle, prev: &State, state: &State, rng: &mut Rng, v: &mut Verdict) {
    let mut fresh = Vec::new();
    let mut old = Vec::new();
    for ((t, q), msgs) in state {
        let before = prev.get(&(t.clone(), *q)).map_or(0, |k| k.len());
        for (i, k) in msgs.iter().enumerate() {
            let item = (t.clone(), *q, i as u64, k.clone());
            (if i < before { &mut old } else { &mut fresh }).push(item);
        }
    }
    if old.len() > OLD_LOOKUPS {
        for i in 0..OLD_LOOKUPS {
            let j = rng.range(i as u64, old.len() as u64 - 1) as usize;
            old.swap(i, j);
        }
        old.truncate(OLD_LOOKUPS);
    }
    fresh.extend(old);
    v.lookups = fresh.len();
    let chunk = fresh.len().div_ceil(LOOKUP_THREADS).max(1);
    let results: Vec<Vec<(bool, String, String)>> = std::thread::scope(|s| {
        let joins: Vec<_> = fresh
            .chunks(chunk)
            .map(|part| s.spawn(move || part.iter().filter_map(|it| lookup_one(h, it)).collect()))
            .collect();
        joins
            .into_iter()
            .map(|j| j.join().expect("lookup thread"))
            .collect()
    });
    for (acked, uniq, why) in results.into_iter().flatten() {
        v.fail(!acked, acked.then_some(uniq.as_str()), why);
    }
}

/// Looks one message up by id and by key; `Some((acked, uniq key, why))` on failure.
fn lookup_one(
    h: &Handle,
    (t, q, i, k): &(String, i32, u64, Known),
) -> Option<(bool, String, String)> {
    let rec = &k.rec;
    let uniq = rec.uniq_key().to_string();
    let at = format!(
        "{t}/{q} queue offset {i} (log offset {}, key {uniq})",
        rec.log_offset
    );
    let fail = |why: String| Some((k.acked, uniq.clone(), format!("{at}: {why}")));
    match block_on(h.look_by_msg_id(&rec.msg_id)) {
        Ok(Some(m)) => {
            if (m.topic.as_str(), m.queue_id, m.queue_offset) != (t.as_str(), *q, *i)
                || Rec::of(&m) != *rec
            {
                return fail(format!(
                    "look_by_msg_id({}) found {:?}",
                    rec.msg_id,
                    Rec::of(&m)
                ));
            }
        }
        Ok(None) => return fail(format!("look_by_msg_id({}) found nothing", rec.msg_id)),
        Err(e) => return fail(format!("look_by_msg_id({}) failed: {e}", rec.msg_id)),
    }
    match block_on(h.query_by_key(t, &uniq, 8, 0, i64::MAX)) {
        Ok(hits) => {
            let offsets: Vec<u64> = hits.iter().map(|m| m.log_offset).collect();
            if offsets != [rec.log_offset] {
                return fail(format!("query_by_key found log offsets {offsets:?}"));
            }
            if Rec::of(&hits[0]) != *rec {
                return fail(format!("query_by_key found {:?}", Rec::of(&hits[0])));
            }
        }
        Err(e) => return fail(format!("query_by_key failed: {e}")),
    }
    None
}

/// This process's open descriptors: (number, what it points at).
fn open_fds() -> BTreeSet<(String, String)> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let target = std::fs::read_link(e.path()).ok()?;
            Some((
                e.file_name().to_string_lossy().into_owned(),
                target.display().to_string(),
            ))
        })
        .collect()
}

enum Event {
    Opened(u128),
    Done(Verdict),
}

/// Opens the store, checks it against `prev` and `acks`, shuts it down. Runs on its
/// own thread; reports the open separately so the parent can time recovery.
fn verify(
    root: PathBuf,
    prev: Arc<State>,
    mut acks: Acks,
    seed: u64,
    full: bool,
    tx: std::sync::mpsc::Sender<Event>,
) {
    let mut v = Verdict::default();
    let fds_before = open_fds();
    let started = Instant::now();
    let store = match ShardedStore::open(config(&root)) {
        Ok(s) => s,
        Err(e) => {
            let kind = if matches!(e, Error::Corrupt { .. }) {
                "refused as corrupt"
            } else {
                "failed"
            };
            v.fail(true, None, format!("reopening after kill -9 {kind}: {e}"));
            let _ = tx.send(Event::Done(v));
            return;
        }
    };
    v.open_ms = started.elapsed().as_millis();
    let _ = tx.send(Event::Opened(v.open_ms));
    let h = store.handle();
    for shard in 0..SHARDS {
        match block_on(h.shard_status(shard)) {
            Ok(st) if st.failure.is_some() => v.fail(
                true,
                None,
                format!("shard {shard} failed after recovery: {:?}", st.failure),
            ),
            Ok(_) => {}
            Err(e) => v.fail(true, None, format!("shard {shard} status: {e}")),
        }
    }
    if let Err(e) = block_on(h.wait_dispatched()) {
        v.fail(true, None, format!("wait_dispatched: {e}"));
    }
    let mut rng = Rng::new(seed);
    let state = compare(&h, &prev, &mut acks, full, &mut rng, &mut v);
    lookups(&h, &prev, &state, &mut rng, &mut v);
    if let Err(e) = store.shutdown() {
        v.fail(true, None, format!("shutdown after verification: {e}"));
    }
    // Every file the store opened must be closed once it is shut down (glommio 0.9
    // leaks one eventfd per executor, DataDog/glommio#448: not ours, not counted).
    let leaked: Vec<String> = open_fds()
        .difference(&fds_before)
        .filter(|(_, target)| target != "anon_inode:[eventfd]")
        .map(|(fd, target)| format!("{fd} -> {target}"))
        .collect();
    if !leaked.is_empty() {
        v.fail(
            true,
            None,
            format!(
                "open + shutdown leaked {} file descriptors, e.g. {:?}",
                leaked.len(),
                &leaked[..leaked.len().min(5)]
            ),
        );
    }
    v.state = Some(state);
    let _ = tx.send(Event::Done(v));
}

/// Runs `verify` on a watchdog: recovery over `OPEN_TIMEOUT` or a verification over
/// `VERIFY_TIMEOUT` is a failure (the stuck thread is left behind).
fn verify_with_watchdog(
    root: &Path,
    prev: Arc<State>,
    acks: Acks,
    seed: u64,
    full: bool,
) -> Verdict {
    let (tx, rx) = std::sync::mpsc::channel();
    let root2 = root.to_path_buf();
    std::thread::Builder::new()
        .name("crash-loop-verify".into())
        .spawn(move || verify(root2, prev, acks, seed, full, tx))
        .expect("spawn verifier");
    let hung = |why: String| {
        let mut v = Verdict::default();
        v.fail(true, None, why);
        v
    };
    match rx.recv_timeout(OPEN_TIMEOUT) {
        Ok(Event::Opened(ms)) => eprintln!("  reopened in {ms} ms"),
        Ok(Event::Done(v)) => return v,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            return hung(format!(
                "reopening (recovery) took more than {} s: hang?",
                OPEN_TIMEOUT.as_secs()
            ));
        }
        Err(_) => return hung("the verifier thread panicked while opening the store".into()),
    }
    match rx.recv_timeout(VERIFY_TIMEOUT) {
        Ok(Event::Done(v)) => v,
        Ok(Event::Opened(_)) => unreachable!("opened twice"),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => hung(format!(
            "verification took more than {} s: hang?",
            VERIFY_TIMEOUT.as_secs()
        )),
        Err(_) => hung("the verifier thread panicked (see its message above)".into()),
    }
}

/// `coremq inspect check DIR`: `None` when clean, else its output.
fn inspect_check(root: &Path) -> Option<String> {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_coremq"))
        .args(["inspect", "check"])
        .arg(root)
        .output()
        .expect("run coremq inspect check");
    if out.status.success() {
        return None;
    }
    Some(format!(
        "coremq inspect check {} exited with {}:\n{}{}",
        root.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

/// When the parent kills a writer.
#[derive(Debug, Clone, Copy)]
enum Kill {
    /// This many ms after the spawn, opened or not: often while the writer is still
    /// starting or recovering the store.
    AfterSpawn(u64),
    /// This many ms after the writer reports its store open: mid-load.
    AfterOpen(u64),
}

/// Mostly mid-load kills; the second writer of a cycle is killed sooner.
fn kill_at(rng: &mut Rng, second: bool) -> Kill {
    match rng.range(0, 99) {
        0..=29 => Kill::AfterSpawn(rng.range(0, 400)),
        _ if second => Kill::AfterOpen(rng.range(0, 100)),
        _ => Kill::AfterOpen(rng.range(0, 400)),
    }
}

/// How one writer child ended.
struct ChildRun {
    acks: Vec<((String, i32, u64), Rec)>,
    /// When the writer reported its store open (ms after the spawn, its own clock).
    open_ms: Option<u64>,
    /// When it was killed (ms after the spawn).
    killed_ms: u128,
}

/// Spawns a writer, SIGKILLs it as `kill` says, collects its acks. `Err` when the
/// writer died on its own (for instance, its open refused the store) or did not
/// open the store within `OPEN_TIMEOUT`.
fn run_child(
    work: &Path,
    root: &Path,
    name: &str,
    seed: u64,
    kill: Kill,
) -> Result<ChildRun, String> {
    let acks = work.join(format!("acks-{name}"));
    let opened = work.join(format!("opened-{name}"));
    let log = work.join(format!("child-{name}.log"));
    let envs: Vec<(&str, OsString)> = vec![
        (CHILD_ENV, root.into()),
        (ACKS_ENV, acks.clone().into()),
        (OPENED_ENV, opened.clone().into()),
        (CHILD_SEED_ENV, seed.to_string().into()),
        (PREFIX_ENV, name.into()),
    ];
    let mut child = spawn_self("crash_loop_child", &envs, &log);
    let started = Instant::now();
    let mut seen_open: Option<Duration> = None;
    loop {
        let now = started.elapsed();
        if seen_open.is_none() && opened.exists() {
            seen_open = Some(now);
        }
        let due = match (kill, seen_open) {
            (Kill::AfterSpawn(ms), _) => now >= Duration::from_millis(ms),
            (Kill::AfterOpen(ms), Some(at)) => now >= at + Duration::from_millis(ms),
            (Kill::AfterOpen(_), None) => false,
        };
        if due {
            break;
        }
        if let Some(status) = child.try_wait().unwrap() {
            return Err(format!(
                "writer {name} exited on its own ({status}) {} ms after it started:\n{}",
                now.as_millis(),
                log_tail(&log, 4000)
            ));
        }
        if seen_open.is_none() && now > OPEN_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "writer {name} did not open the store within {} s (recovery hang?):\n{}",
                OPEN_TIMEOUT.as_secs(),
                log_tail(&log, 4000)
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    child.kill().expect("SIGKILL the writer");
    let killed_ms = started.elapsed().as_millis();
    child.wait().expect("reap the writer");
    let open_ms = std::fs::read_to_string(&opened)
        .ok()
        .and_then(|s| s.trim().parse().ok());
    Ok(ChildRun {
        acks: read_acks(&acks),
        open_ms,
        killed_ms,
    })
}

/// Runs the crash loop for `cycles` cycles (stopping at the first failing one).
fn crash_loop(cycles: usize, seed: u64, full_every: usize) -> Stats {
    let mut rng = Rng::new(seed);
    let tmp = match std::env::var_os("COREMQ_CRASH_DIR") {
        Some(d) => {
            std::fs::create_dir_all(&d).unwrap();
            tempfile::tempdir_in(d).unwrap()
        }
        None => tempfile::tempdir().unwrap(),
    };
    let work = tmp.path().to_path_buf();
    let root = work.join("store");
    let mut state = Arc::new(State::new());
    let mut stats = Stats::default();
    let mut lost_keys = BTreeSet::new();
    let run_started = Instant::now();
    for cycle in 0..cycles {
        stats.cycles = cycle + 1;
        let children = if rng.range(0, 3) == 0 { 2 } else { 1 };
        let mut acks = Acks::new();
        let mut failures = Vec::new();
        let mut notes = Vec::new();
        for k in 0..children {
            let kill = kill_at(&mut rng, k == 1);
            let name = format!("c{cycle}k{k}");
            stats.children += 1;
            match run_child(&work, &root, &name, rng.next_u64(), kill) {
                Ok(run) => {
                    if run.open_ms.is_none() {
                        stats.early_kills += 1;
                    }
                    notes.push(format!(
                        "{name} ({kill:?}) killed at {} ms ({}), {} acks",
                        run.killed_ms,
                        run.open_ms
                            .map_or("before it had opened".to_string(), |ms| {
                                format!("open after {ms} ms")
                            }),
                        run.acks.len()
                    ));
                    for (key, rec) in run.acks {
                        if let Some(prev) = acks.insert(key.clone(), rec.clone()) {
                            failures
                                .push(format!("{key:?} acknowledged twice: {prev:?} and {rec:?}"));
                        }
                    }
                }
                Err(why) => failures.push(why),
            }
        }
        stats.acked += acks.len();
        let new_acks = acks.len();
        eprintln!(
            "cycle {cycle}: {} (+{new_acks} acks, {} total)",
            notes.join("; "),
            stats.acked
        );
        let full = full_every <= 1 || (cycle + 1) % full_every == 0 || cycle + 1 == cycles;
        if full {
            stats.full_checks += 1;
        }
        let mut v = if failures.is_empty() {
            verify_with_watchdog(&root, state.clone(), acks, rng.next_u64(), full)
        } else {
            let mut v = Verdict::default();
            for f in failures {
                v.fail(true, None, f);
            }
            v
        };
        if full
            && v.corrupt == 0
            && v.state.is_some()
            && let Some(report) = inspect_check(&root)
        {
            v.fail(true, None, report);
        }
        lost_keys.extend(v.lost.iter().cloned());
        stats.corrupt += v.corrupt;
        stats.lost = lost_keys.len();
        let messages = v
            .state
            .as_ref()
            .map_or(0, |s| s.values().map(Vec::len).sum::<usize>());
        if let Some(s) = v.state.take() {
            state = Arc::new(s);
        }
        let acked_now: usize = state.values().flatten().filter(|k| k.acked).count();
        stats.verified = acked_now.saturating_sub(v.lost.len());
        eprintln!(
            "  {messages} messages in the store ({acked_now} acknowledged), {} looked up by id and key, {} check; {:.1} s into the run",
            v.lookups,
            if full {
                "whole-store"
            } else {
                "tail and sample"
            },
            run_started.elapsed().as_secs_f64()
        );
        if !v.failures.is_empty() {
            eprintln!("cycle {cycle}: FAILED (seed {seed}):");
            for f in &v.failures {
                eprintln!("  - {f}");
            }
            let kept = tmp.keep();
            eprintln!(
                "the store and the writers' logs are kept in {}",
                kept.display()
            );
            return stats;
        }
        if rng.range(0, 1) == 0 {
            // As if killed right after the clean shutdown: the next writer recovers
            // from the checkpoint with a whole-tail scan.
            for i in 0..SHARDS {
                let shard = root.join(format!("shard-{i}"));
                if shard.is_dir() {
                    mark_unclean(&shard);
                }
            }
        }
    }
    stats
}

fn env_usize(var: &str, default: usize) -> usize {
    match std::env::var(var) {
        Ok(s) => s
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{var}={s:?} is not a number")),
        Err(_) => default,
    }
}

#[test]
fn crash_loop_keeps_every_acknowledged_put() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let cycles = env_usize("COREMQ_CRASH_CYCLES", 8);
    let seed = seed_from_env("COREMQ_CRASH_SEED");
    let full_every = env_usize("COREMQ_CRASH_FULL_EVERY", 1);
    let s = crash_loop(cycles, seed, full_every);
    eprintln!(
        "writers: {} ({} killed before their store was open)",
        s.children, s.early_kills
    );
    println!(
        "cycles={} acked={} verified={} lost={} corrupt={} seed={seed} whole_store_checks={}",
        s.cycles, s.acked, s.verified, s.lost, s.corrupt, s.full_checks
    );
    assert!(
        s.lost == 0 && s.corrupt == 0,
        "crash loop failed (seed {seed}): lost={} corrupt={} (details above)",
        s.lost,
        s.corrupt
    );
}
