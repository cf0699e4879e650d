//! kill -9 of a SYNC_MASTER mid-stream (issue 17): every message it acknowledged is on
//! its slave, and the slave, promoted to master, takes the producers on.
//!
//! The test re-runs its own binary as the master (`ha_master_child`, active only with
//! `COREMQ_HA_CHILD=<dir>`): a 2-shard SYNC_MASTER store (async flush, the default,
//! and sync flush) with its HA port on a port the parent chose, and four producer
//! threads that append `topic queue queue_offset log_offset body_hash` to an ack file
//! after every `PutOk` (one unbuffered write each; the page cache survives SIGKILL).
//! The parent runs the slave in-process, kills the child after a random 300-1500 ms of
//! acknowledged puts, then checks every acknowledged message on the slave (by offset,
//! by queue position, same body), reopens the slave's directory as a master and puts to
//! every queue: queue offsets continue after the last acknowledged one.
//!
//! Knobs: `COREMQ_HA_CRASH_SEED` (replay), `COREMQ_HA_CRASH_CYCLES` (default 1 per
//! flush mode).
#[path = "common/child.rs"]
mod child;
mod common;

use child::*;
use coremq::shard::SHARD_SHIFT;
use coremq::{
    FlushMode, HaRole, Message, PutStatus, ShardedConfig, ShardedStore, StoreConfig, StoreOps,
    StoredMessage,
};
use futures_lite::future::block_on;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "COREMQ_HA_CHILD";
const ACKS_ENV: &str = "COREMQ_HA_ACKS";
const PORT_ENV: &str = "COREMQ_HA_PORT";
const FLUSH_ENV: &str = "COREMQ_HA_FLUSH";
/// Two topics whose queues 0-3 sit on different shards of two.
const TOPICS: [&str; 2] = ["HaOrders", "HaLogs"];

fn config(root: &Path, role: HaRole, flush: FlushMode) -> ShardedConfig {
    let mut cfg = ShardedConfig::new(root);
    cfg.shards = 2;
    cfg.pin = false;
    cfg.store = StoreConfig::small_for_tests(root);
    cfg.store.flush_mode = flush;
    let ha = &mut cfg.store.ha;
    ha.role = role;
    ha.heartbeat_interval = Duration::from_millis(200);
    ha.housekeeping_interval = Duration::from_secs(2);
    ha.reconnect_interval = Duration::from_millis(100);
    ha.sync_timeout = Duration::from_secs(2);
    cfg
}

/// The master: puts until killed (only with `COREMQ_HA_CHILD` set).
#[test]
fn ha_master_child() {
    let Some(root) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let acks = PathBuf::from(std::env::var_os(ACKS_ENV).unwrap());
    let port: u16 = std::env::var(PORT_ENV).unwrap().parse().unwrap();
    let flush = match std::env::var(FLUSH_ENV).as_deref() {
        Ok("sync") => FlushMode::Sync,
        _ => FlushMode::Async,
    };
    let mut cfg = config(Path::new(&root), HaRole::SyncMaster, flush);
    cfg.store.ha.listen = Some(SocketAddr::from(([127, 0, 0, 1], port)));
    let store = ShardedStore::open(cfg).expect("child: open the master");
    let file = std::sync::Arc::new(std::sync::Mutex::new(
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&acks)
            .unwrap(),
    ));
    let mut threads = Vec::new();
    for w in 0..4u64 {
        let (h, file) = (store.handle(), file.clone());
        threads.push(std::thread::spawn(move || {
            let mut rng = Rng::new(w + 1);
            let topic = TOPICS[(w % 2) as usize];
            loop {
                let q = rng.range(0, 3) as i32;
                let mut b = vec![0u8; rng.range(1, 3000) as usize];
                rng.fill(&mut b);
                let r =
                    block_on(h.put(Message::new(topic, q, b.clone()).with_keys(format!("w{w}"))));
                match r.status {
                    PutStatus::PutOk => {
                        let line = format!(
                            "{topic} {q} {} {} {:016x}\n",
                            r.queue_offset,
                            r.log_offset,
                            fnv1a(&b)
                        );
                        file.lock().unwrap().write_all(line.as_bytes()).unwrap();
                    }
                    // No slave yet (or one that fell behind): stored, not acknowledged.
                    _ => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        }));
    }
    std::thread::sleep(Duration::from_secs(60));
    eprintln!("child: not killed within 60 s");
    std::process::exit(3);
}

type Acks = BTreeMap<(String, i32, u64), (u64, u64)>;

fn read_acks(path: &Path) -> Acks {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let whole = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
    whole
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (
                (
                    f[0].to_string(),
                    f[1].parse().unwrap(),
                    f[2].parse().unwrap(),
                ),
                (
                    f[3].parse().unwrap(),
                    u64::from_str_radix(f[4], 16).unwrap(),
                ),
            )
        })
        .collect()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn kill_master_then_promote_slave(flush: FlushMode, cycle: u64, rng: &mut Rng) {
    let tmp = tempfile::tempdir().unwrap();
    let (mroot, sroot) = (tmp.path().join("master"), tmp.path().join("slave"));
    let port = free_port();
    let master_addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut scfg = config(&sroot, HaRole::Slave, flush);
    scfg.store.ha.master_address = Some(master_addr);
    let slave = ShardedStore::open(scfg).unwrap();
    let acks_path = tmp.path().join("acks");
    let log = tmp.path().join("child.log");
    let flush_name = if flush == FlushMode::Sync {
        "sync"
    } else {
        "async"
    };
    let envs: Vec<(&str, OsString)> = vec![
        (CHILD_ENV, mroot.clone().into()),
        (ACKS_ENV, acks_path.clone().into()),
        (PORT_ENV, port.to_string().into()),
        (FLUSH_ENV, flush_name.into()),
    ];
    let mut child = spawn_self("ha_master_child", &envs, &log);
    let started = Instant::now();
    while read_acks(&acks_path).len() < 20 {
        if let Some(s) = child.try_wait().unwrap() {
            panic!("master child exited ({s}):\n{}", log_tail(&log, 4000));
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the master acknowledged nothing:\n{}",
            log_tail(&log, 4000)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let delay = rng.range(300, 1500);
    std::thread::sleep(Duration::from_millis(delay));
    child.kill().unwrap();
    child.wait().unwrap();
    let acks = read_acks(&acks_path);
    let h = slave.handle();
    block_on(h.wait_dispatched()).unwrap();
    for ((topic, q, qoff), (log_off, hash)) in &acks {
        let m = block_on(h.look_by_offset(*log_off))
            .unwrap()
            .unwrap_or_else(|| {
                panic!("cycle {cycle} ({flush_name}): acknowledged {topic}/{q}/{qoff} at {log_off} is not on the slave")
            });
        assert_eq!(
            (m.topic.as_str(), m.queue_id, m.queue_offset),
            (topic.as_str(), *q, *qoff)
        );
        assert_eq!(fnv1a(&m.body), *hash, "{topic}/{q}/{qoff}: body differs");
        let g = block_on(h.get(topic, *q, *qoff, 1, 1 << 20)).unwrap();
        let got = StoredMessage::decode(&g.records[0]).unwrap();
        assert_eq!(got.log_offset, *log_off);
    }
    eprintln!(
        "cycle {cycle} ({flush_name}): killed after {delay} ms, {} acknowledged messages all on the slave",
        acks.len()
    );
    // Promotion: the slave's directory reopened as a master; producers continue.
    slave.shutdown().unwrap();
    let promoted = ShardedStore::open(config(&sroot, HaRole::AsyncMaster, flush)).unwrap();
    let h = promoted.handle();
    let mut last: BTreeMap<(String, i32), u64> = BTreeMap::new();
    for (topic, q, qoff) in acks.keys() {
        let e = last.entry((topic.clone(), *q)).or_default();
        *e = (*e).max(qoff + 1);
    }
    for ((topic, q), next) in &last {
        let r = block_on(h.put(Message::new(topic.as_str(), *q, "after promotion")));
        assert_eq!(r.status, PutStatus::PutOk);
        assert!(
            r.queue_offset >= *next,
            "{topic}/{q}: queue offsets continue"
        );
        assert_eq!(r.log_offset >> SHARD_SHIFT, h.shard_of(topic, *q) as u64);
    }
    promoted.shutdown().unwrap();
}

#[test]
fn kill9_sync_master_every_ack_is_on_the_slave_then_promote() {
    let seed = seed_from_env("COREMQ_HA_CRASH_SEED");
    let mut rng = Rng::new(seed);
    let cycles: u64 = std::env::var("COREMQ_HA_CRASH_CYCLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    for cycle in 0..cycles {
        kill_master_then_promote_slave(FlushMode::Async, cycle, &mut rng);
        kill_master_then_promote_slave(FlushMode::Sync, cycle, &mut rng);
    }
}
