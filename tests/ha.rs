//! Master/slave replication (issue 17), two sharded stores in one process on loopback,
//! each with its own data directory and HA port:
//!
//! * catch-up: after the slave catches up, every shard's commit log is byte-identical
//!   to the master's up to the end (the bytes compared), `inspect check` passes on
//!   both, and gets, key queries and look-ups on the slave find every message;
//! * an empty slave starts at the master's last segment (its log begins past its base)
//!   and reopens cleanly;
//! * SYNC_MASTER: no slave -> `SlaveNotAvailable` (stored); slave connected -> `PutOk`
//!   only once its report came (reports held by a proxy: `FlushSlaveTimeout`); the
//!   slave stopped -> `FlushSlaveTimeout`, then `SlaveNotAvailable`;
//! * a proxy that corrupts record bytes, cuts the stream mid-frame or shifts a frame's
//!   offset: the slave refuses, reconnects, and nothing bad is written;
//! * slave restarted, master restarted, slave far behind catching up while puts go on;
//! * a slave whose log runs past its master's refuses to follow, names both offsets,
//!   and `ha::truncate` brings it back (the cut bytes in lost+found);
//! * a slave refuses puts.
mod common;
#[path = "common/proxy.rs"]
mod proxy;

use common::body;
use coremq::shard::SHARD_SHIFT;
use coremq::tools::inspect;
use coremq::{
    EmptySlaveStart, GetStatus, HaRole, Message, PutStatus, ShardedConfig, ShardedStore,
    StoreConfig, StoreOps, StoredMessage,
};
use futures_lite::future::block_on;
use proxy::{Fault, Proxy};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const SHARDS: usize = 2;
// With 2 shards, queues 0-3 of each topic sit on one shard (see `shard_of`): one topic per shard.
const TOPICS: [&str; 2] = ["HaOrders", "HaLogs"];
const QUEUES: i32 = 4;

fn config(root: &Path, role: HaRole, master: Option<SocketAddr>) -> ShardedConfig {
    let mut cfg = ShardedConfig::new(root);
    cfg.shards = SHARDS;
    cfg.pin = false;
    cfg.store = StoreConfig::small_for_tests(root);
    let ha = &mut cfg.store.ha;
    ha.role = role;
    ha.listen = Some("127.0.0.1:0".parse().unwrap());
    ha.master_address = master;
    ha.heartbeat_interval = Duration::from_millis(200);
    ha.housekeeping_interval = Duration::from_secs(3);
    ha.reconnect_interval = Duration::from_millis(100);
    ha.sync_timeout = Duration::from_millis(1500);
    ha.max_frame_bytes = 64 << 10;
    cfg
}

fn open(cfg: ShardedConfig) -> (ShardedStore, SocketAddr) {
    let s = ShardedStore::open(cfg).expect("open");
    let addr = s.ha().and_then(|h| h.listen_addr).expect("HA listening");
    (s, addr)
}

fn message(t: &str, q: i32, i: u64) -> Message {
    Message::new(t, q, body(t, q, i))
        .with_tags("ha")
        .with_keys(format!("key-{t}-{q}-{i}"))
}

/// Puts `n` messages per queue (numbered from `from`); returns every result.
fn produce(h: &coremq::Handle, from: u64, n: u64) -> Vec<coremq::PutResult> {
    let mut out = Vec::new();
    for i in from..from + n {
        for t in TOPICS {
            for q in 0..QUEUES {
                let r = block_on(h.put(message(t, q, i)));
                assert!(r.status.is_stored(), "put {t}/{q}/{i}: {:?}", r.status);
                out.push(r);
            }
        }
    }
    out
}

fn ends(h: &coremq::Handle) -> Vec<u64> {
    (0..SHARDS)
        .map(|s| block_on(h.shard_status(s)).unwrap().max_log_offset)
        .collect()
}

/// Waits until every slave shard's end equals the master's (the master flushed).
fn caught_up(master: &coremq::Handle, slave: &coremq::Handle) -> Vec<u64> {
    block_on(master.flush()).unwrap();
    let want = ends(master);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = ends(slave);
        if got == want {
            return want;
        }
        assert!(
            Instant::now() < deadline,
            "slave never caught up: master {want:?}, slave {got:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The bytes `[from, to)` of a store root's commit log.
fn log_bytes(root: &Path, seg: u64, from: u64, to: u64) -> Vec<u8> {
    let mut out = Vec::new();
    let mut pos = from;
    while pos < to {
        let start = pos / seg * seg;
        let path = root.join("commitlog").join(format!("{start:020}"));
        let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let end = to.min(start + seg);
        out.extend_from_slice(&data[(pos - start) as usize..(end - start) as usize]);
        pos = end;
    }
    out
}

fn shard_root(root: &Path, s: usize) -> PathBuf {
    root.join(format!("shard-{s}"))
}

/// Every shard's log is byte-identical on both sides over `[from[s], end[s])`.
fn assert_identical(master: &Path, slave: &Path, from: &[u64], end: &[u64]) {
    let seg = StoreConfig::small_for_tests(master).commit_log_segment_bytes;
    for s in 0..SHARDS {
        let a = log_bytes(&shard_root(master, s), seg, from[s], end[s]);
        let b = log_bytes(&shard_root(slave, s), seg, from[s], end[s]);
        assert_eq!(a.len(), b.len());
        if let Some(i) = a.iter().zip(&b).position(|(x, y)| x != y) {
            panic!(
                "shard {s}: logs differ at offset {} (of [{}, {}))",
                from[s] + i as u64,
                from[s],
                end[s]
            );
        }
    }
}

fn bases() -> Vec<u64> {
    (0..SHARDS as u64).map(|s| s << SHARD_SHIFT).collect()
}

fn check_clean(root: &Path) {
    let mut out = Vec::new();
    let clean = inspect::print_check(root, &mut out).unwrap();
    assert!(
        clean,
        "inspect check failed on {}:\n{}",
        root.display(),
        String::from_utf8_lossy(&out)
    );
}

/// Every acknowledged message is on `h` at its queue offset, by get, key and id.
fn assert_has(h: &coremq::Handle, acked: &[coremq::PutResult], keys_every: usize) {
    for (n, r) in acked.iter().enumerate() {
        let m = block_on(h.look_by_offset(r.log_offset))
            .unwrap()
            .unwrap_or_else(|| panic!("no record at {}", r.log_offset));
        assert_eq!(m.queue_offset, r.queue_offset);
        let g = block_on(h.get(&m.topic, m.queue_id, m.queue_offset, 1, 1 << 20)).unwrap();
        assert_eq!(g.status, GetStatus::Found, "get {}/{}", m.topic, m.queue_id);
        let got = StoredMessage::decode(&g.records[0]).unwrap();
        assert_eq!(got.log_offset, r.log_offset);
        if n % keys_every == 0 {
            let key = m.property("KEYS").unwrap().to_string();
            let hits = block_on(h.query_by_key(&m.topic, &key, 4, 0, i64::MAX)).unwrap();
            assert!(
                hits.iter().any(|x| x.log_offset == r.log_offset),
                "key {key} not found"
            );
        }
    }
}

#[test]
fn slave_catches_up_byte_identical_and_serves_reads() {
    let dir = tempfile::tempdir().unwrap();
    let (mroot, sroot) = (dir.path().join("master"), dir.path().join("slave"));
    let (master, addr) = open(config(&mroot, HaRole::AsyncMaster, None));
    let (slave, _) = open(config(&sroot, HaRole::Slave, Some(addr)));
    let (mh, sh) = (master.handle(), slave.handle());
    // Several segments (1 MiB each) per shard, records straddling windows and ends.
    let acked = produce(&mh, 0, 450);
    let end = caught_up(&mh, &sh);
    assert!(
        end.iter().zip(bases()).all(|(e, b)| e - b > 2 << 20),
        "{end:?}"
    );
    block_on(sh.flush()).unwrap();
    assert_identical(&mroot, &sroot, &bases(), &end);
    block_on(sh.wait_dispatched()).unwrap();
    assert_has(&sh, &acked, 7);
    // A slave takes no puts.
    let r = block_on(sh.put(message(TOPICS[0], 0, 0)));
    assert_eq!(r.status, PutStatus::SlaveMode);
    slave.shutdown().unwrap();
    master.shutdown().unwrap();
    check_clean(&mroot);
    check_clean(&sroot);
}

#[test]
fn empty_slave_starts_at_the_masters_last_segment() {
    let dir = tempfile::tempdir().unwrap();
    let (mroot, sroot) = (dir.path().join("master"), dir.path().join("slave"));
    let (master, addr) = open(config(&mroot, HaRole::AsyncMaster, None));
    let mh = master.handle();
    produce(&mh, 0, 300);
    block_on(mh.flush()).unwrap();
    let seg = StoreConfig::small_for_tests(&mroot).commit_log_segment_bytes;
    let starts: Vec<u64> = ends(&mh).iter().map(|e| e / seg * seg).collect();
    assert!(starts.iter().zip(bases()).all(|(s, b)| *s > b));
    let mut scfg = config(&sroot, HaRole::Slave, Some(addr));
    scfg.store.ha.empty_slave_start = EmptySlaveStart::LastSegment;
    let (slave, _) = open(scfg);
    let sh = slave.handle();
    // The master picks the start at connect (its first frame, a heartbeat when idle,
    // moves the empty log there); no put meanwhile, so the last segment stays.
    wait_for(
        "every slave shard to begin at the master's last segment",
        10,
        || {
            starts
                .iter()
                .enumerate()
                .all(|(s, start)| block_on(sh.shard_status(s)).unwrap().min_log_offset == *start)
        },
    );
    let acked = produce(&mh, 300, 20);
    let end = caught_up(&mh, &sh);
    block_on(sh.flush()).unwrap();
    assert_identical(&mroot, &sroot, &starts, &end);
    block_on(sh.wait_dispatched()).unwrap();
    assert_has(&sh, &acked, 3);
    slave.shutdown().unwrap();
    check_clean(&sroot);
    // Reopened, the late-starting log recovers and follows on.
    let (slave, _) = open(config(&sroot, HaRole::Slave, Some(addr)));
    let sh = slave.handle();
    let more = produce(&mh, 320, 10);
    let end = caught_up(&mh, &sh);
    block_on(sh.flush()).unwrap();
    assert_identical(&mroot, &sroot, &starts, &end);
    block_on(sh.wait_dispatched()).unwrap();
    assert_has(&sh, &more, 1);
    slave.shutdown().unwrap();
    master.shutdown().unwrap();
    check_clean(&sroot);
}

fn wait_for(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn status(s: &ShardedStore) -> std::sync::Arc<coremq::ha::HaStatus> {
    s.ha().expect("HA service").status().clone()
}

#[test]
fn sync_master_statuses() {
    let dir = tempfile::tempdir().unwrap();
    let (mroot, sroot) = (dir.path().join("master"), dir.path().join("slave"));
    let (master, addr) = open(config(&mroot, HaRole::SyncMaster, None));
    let mh = master.handle();
    // No slave: stored, but not replicated, and said so at once.
    let t0 = Instant::now();
    let r = block_on(mh.put(message(TOPICS[0], 0, 0)));
    assert_eq!(r.status, PutStatus::SlaveNotAvailable);
    assert!(
        t0.elapsed() < Duration::from_millis(1000),
        "returned at once"
    );
    block_on(mh.wait_dispatched()).unwrap();
    assert!(
        block_on(mh.look_by_offset(r.log_offset)).unwrap().is_some(),
        "stored"
    );
    let proxy = Proxy::start(addr);
    let (slave, _) = open(config(&sroot, HaRole::Slave, Some(proxy.addr)));
    let (sh, st) = (slave.handle(), status(&slave));
    wait_for("slave connected", 10, || {
        (0..SHARDS).all(|s| st.connected(s))
    });
    caught_up(&mh, &sh);
    // Connected and in sync: PutOk, and by then the slave has the record.
    for q in 0..QUEUES {
        let r = block_on(mh.put(message(TOPICS[1], q, 1)));
        assert_eq!(r.status, PutStatus::PutOk);
        let shard = (r.log_offset >> SHARD_SHIFT) as usize;
        let slave_end = block_on(sh.shard_status(shard)).unwrap().max_log_offset;
        assert!(
            slave_end >= r.log_offset + r.wrote_bytes as u64,
            "acknowledged before the slave had it"
        );
    }
    // The slave receives the bytes but its reports are held: the put times out.
    proxy.set(Fault::HoldReports);
    let t0 = Instant::now();
    let r = block_on(mh.put(message(TOPICS[0], 1, 2)));
    assert_eq!(r.status, PutStatus::FlushSlaveTimeout);
    assert!(
        t0.elapsed() >= Duration::from_millis(1400),
        "{:?}",
        t0.elapsed()
    );
    let shard = (r.log_offset >> SHARD_SHIFT) as usize;
    wait_for("the slave to hold the timed-out record", 10, || {
        block_on(sh.shard_status(shard)).unwrap().max_log_offset
            >= r.log_offset + r.wrote_bytes as u64
    });
    // Reports flow again: the next put is acknowledged.
    proxy.set(Fault::None);
    let r = block_on(mh.put(message(TOPICS[0], 1, 3)));
    assert_eq!(r.status, PutStatus::PutOk);
    // A put waiting when the slave stops: FlushSlaveTimeout; then SlaveNotAvailable.
    proxy.set(Fault::HoldReports);
    let h2 = mh.clone();
    let waiting = std::thread::spawn(move || block_on(h2.put(message(TOPICS[0], 2, 4))).status);
    std::thread::sleep(Duration::from_millis(300));
    slave.shutdown().unwrap();
    assert_eq!(waiting.join().unwrap(), PutStatus::FlushSlaveTimeout);
    wait_for("the master to see the slave gone", 10, || {
        block_on(mh.put(message(TOPICS[0], 3, 5))).status == PutStatus::SlaveNotAvailable
    });
    drop(proxy);
    master.shutdown().unwrap();
}

#[test]
fn broken_frames_are_refused_and_nothing_bad_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let (mroot, sroot) = (dir.path().join("master"), dir.path().join("slave"));
    let (master, addr) = open(config(&mroot, HaRole::AsyncMaster, None));
    let proxy = Proxy::start(addr);
    let (slave, _) = open(config(&sroot, HaRole::Slave, Some(proxy.addr)));
    let (mh, sh, st) = (master.handle(), slave.handle(), status(&slave));
    let mut acked = produce(&mh, 0, 20);
    caught_up(&mh, &sh);
    let mut n = 20;
    for fault in [Fault::CorruptBody, Fault::ShiftOffset, Fault::CutMidFrame] {
        let (refused, connects) = (
            (0..SHARDS).map(|s| st.refused(s)).sum::<u64>(),
            (0..SHARDS).map(|s| st.connects(s)).sum::<u64>(),
        );
        let applied = proxy.applied();
        proxy.set(fault);
        // Puts go on until the fault fired (it waits for a frame it can break).
        let deadline = Instant::now() + Duration::from_secs(20);
        while proxy.applied() == applied {
            assert!(Instant::now() < deadline, "{fault:?} never applied");
            acked.extend(produce(&mh, n, 2));
            n += 2;
            std::thread::sleep(Duration::from_millis(20));
        }
        let end = caught_up(&mh, &sh);
        block_on(sh.flush()).unwrap();
        assert_identical(&mroot, &sroot, &bases(), &end);
        let connects_now: u64 = (0..SHARDS).map(|s| st.connects(s)).sum();
        assert!(connects_now > connects, "{fault:?}: the slave reconnected");
        if fault != Fault::CutMidFrame {
            let refused_now: u64 = (0..SHARDS).map(|s| st.refused(s)).sum();
            assert!(
                refused_now > refused,
                "{fault:?}: the slave refused the frame"
            );
        }
    }
    block_on(sh.wait_dispatched()).unwrap();
    assert_has(&sh, &acked, 5);
    drop(proxy);
    slave.shutdown().unwrap();
    master.shutdown().unwrap();
    check_clean(&sroot);
}

#[test]
fn restarts_and_a_slave_far_behind_catch_up_while_puts_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let (mroot, sroot) = (dir.path().join("master"), dir.path().join("slave"));
    let (master, addr) = open(config(&mroot, HaRole::AsyncMaster, None));
    let (slave, _) = open(config(&sroot, HaRole::Slave, Some(addr)));
    let (mh, sh) = (master.handle(), slave.handle());
    let mut acked = produce(&mh, 0, 30);
    caught_up(&mh, &sh);
    // Slave restarted: it reports its end and continues from there.
    slave.shutdown().unwrap();
    acked.extend(produce(&mh, 30, 30));
    let (slave, _) = open(config(&sroot, HaRole::Slave, Some(addr)));
    let sh = slave.handle();
    caught_up(&mh, &sh);
    // Master restarted on the same HA port: the slave reconnects and follows on.
    master.shutdown().unwrap();
    let mut mcfg = config(&mroot, HaRole::AsyncMaster, None);
    mcfg.store.ha.listen = Some(addr);
    let (master, _) = open(mcfg);
    let mh = master.handle();
    acked.extend(produce(&mh, 60, 10));
    caught_up(&mh, &sh);
    // Far behind: the slave is away while the master writes several segments, then
    // catches up while a producer keeps putting.
    slave.shutdown().unwrap();
    acked.extend(produce(&mh, 70, 500));
    let (slave, _) = open(config(&sroot, HaRole::Slave, Some(addr)));
    let sh = slave.handle();
    let h2 = mh.clone();
    let producer = std::thread::spawn(move || produce(&h2, 570, 60));
    acked.extend(producer.join().unwrap());
    let end = caught_up(&mh, &sh);
    block_on(sh.flush()).unwrap();
    assert_identical(&mroot, &sroot, &bases(), &end);
    block_on(sh.wait_dispatched()).unwrap();
    assert_has(&sh, &acked, 11);
    slave.shutdown().unwrap();
    master.shutdown().unwrap();
    check_clean(&mroot);
    check_clean(&sroot);
}

#[test]
fn a_slave_past_its_master_refuses_to_follow_until_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let (mroot, sroot) = (dir.path().join("master"), dir.path().join("slave"));
    let (master, addr) = open(config(&mroot, HaRole::AsyncMaster, None));
    let (slave, _) = open(config(&sroot, HaRole::Slave, Some(addr)));
    let (mh, sh) = (master.handle(), slave.handle());
    let acked = produce(&mh, 0, 40);
    caught_up(&mh, &sh);
    slave.shutdown().unwrap();
    master.shutdown().unwrap();
    // The master loses its tail on one shard (as after a power loss in async flush).
    let lost_from = acked
        .iter()
        .rev()
        .find(|r| r.log_offset >> SHARD_SHIFT == 1)
        .map(|r| r.log_offset)
        .unwrap();
    let cut = coremq::ha::truncate::truncate(&mroot, lost_from).unwrap();
    assert!(cut.kept > 0);
    let mut mcfg = config(&mroot, HaRole::AsyncMaster, None);
    mcfg.store.ha.listen = Some(addr);
    let (master, _) = open(mcfg);
    let (slave, _) = open(config(&sroot, HaRole::Slave, Some(addr)));
    let st = status(&slave);
    wait_for("the slave to refuse", 10, || st.divergence().is_some());
    let d = st.divergence().unwrap();
    assert_eq!((d.shard, d.master_end), (1, lost_from));
    assert!(d.slave_end > d.master_end, "{d:?}");
    slave.shutdown().unwrap();
    // The operator cuts the slave back; the cut bytes are kept.
    let cut = coremq::ha::truncate::truncate(&sroot, d.master_end).unwrap();
    assert_eq!(cut.kept, d.slave_end - d.master_end);
    assert!(cut.lost_found.unwrap().exists());
    let (slave, _) = open(config(&sroot, HaRole::Slave, Some(addr)));
    let (mh, sh) = (master.handle(), slave.handle());
    let more = produce(&mh, 40, 10);
    let end = caught_up(&mh, &sh);
    block_on(sh.flush()).unwrap();
    assert_identical(&mroot, &sroot, &bases(), &end);
    block_on(sh.wait_dispatched()).unwrap();
    assert_has(&sh, &more, 1);
    slave.shutdown().unwrap();
    master.shutdown().unwrap();
    check_clean(&sroot);
}
