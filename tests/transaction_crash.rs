//! Transactions across `kill -9`: no half message lost, no decision lost, a rolled
//! back message never delivered, a durably decided one never asked about again.
//!
//! Every cycle (the same data directory throughout):
//! 1. A child (this test binary as `transaction_crash_child`, active only with
//!    `COREMQ_TX_CHILD=<dir>`) serves a node (2 shards, sync flush) and plays a
//!    transactional producer over the protocol: it sends half messages, commits or
//!    rolls back two of every three at once (END_TRANSACTION answered), leaves the
//!    third undecided, and answers the check-backs that come. The decision for a key
//!    is fixed (`rule`). After each answered send it appends `H key`, after each
//!    answered decision `D key` to its ack log (one `write(2)` a line).
//! 2. The parent SIGKILLs it at a seeded moment.
//! 3. The parent serves the same directory, answers every check-back by the rule, and
//!    waits until every acknowledged half message to commit is visible and no
//!    check-back came for three transaction timeouts. Then it checks:
//!    * every acknowledged half message whose rule is commit is in `Tx`;
//!    * no message whose rule is rollback is in `Tx`;
//!    * no check-back ever named a key whose decision was acknowledged (`D`);
//!    * duplicates (a key committed twice) are counted and bounded by two per kill:
//!      only a decision in flight at the kill (commit stored, op record not yet) or a
//!      put-back in flight can be asked about again, as in RocketMQ.
//!
//! The last line printed: `cycles=N halves=H committed=C rolled_back=R checks=K
//! duplicates=D seed=S`. `COREMQ_TX_CYCLES` (default 3), `COREMQ_TX_SEED`.
#![cfg(feature = "node")]
#[path = "common/child.rs"]
mod child;
#[path = "common/remoting.rs"]
mod remoting;

use child::*;
use coremq::node::remoting::RemotingCommand;
use coremq::node::remoting::codes::*;
use coremq::node::{Network, Node, NodeConfig};
use coremq::{FlushMode, ShardedConfig, StoreConfig};
use remoting::*;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "COREMQ_TX_CHILD";
const ACKS_ENV: &str = "COREMQ_TX_ACKS";
const CYCLE_ENV: &str = "COREMQ_TX_CYCLE";
const TIMEOUT_MS: u64 = 800;
const QUEUES: i32 = 4;

fn start(dir: &Path) -> Node {
    let cfg = NodeConfig {
        network: Network::Shards,
        data_dir: dir.to_path_buf(),
        listen: "127.0.0.1:0".parse().unwrap(),
        namesrv_enable: false,
        metrics_enable: false,
        shards: 2,
        pin: false,
        transaction_timeout_ms: TIMEOUT_MS,
        transaction_check_interval_ms: 50,
        transaction_check_max: 1000,
        ..NodeConfig::default()
    };
    let mut store = ShardedConfig::new(dir);
    store.shards = 2;
    store.pin = false;
    store.io_memory_bytes = 8 << 20;
    store.store = StoreConfig::small_for_tests(dir);
    store.store.flush_mode = FlushMode::Sync;
    Node::start_with_store(cfg, store).expect("node starts")
}

/// A key's decision: commit (8) for even numbers, rollback (12) for odd ones.
fn rule(key: &str) -> i32 {
    let n: u64 = key.rsplit('-').next().unwrap().parse().unwrap();
    if n.is_multiple_of(2) { 8 } else { 12 }
}

fn producer(node: &Node) -> Client {
    let mut p = Client::connect(node.broker_addr);
    let body = br#"{"clientID":"px","producerDataSet":[{"groupName":"tg"}],"consumerDataSet":[]}"#;
    assert_eq!(p.call(HEART_BEAT, &[], body).code, SUCCESS);
    p
}

/// END_TRANSACTION with an answer; true when it was taken.
fn end(p: &mut Client, log: &str, q: &str, kind: i32, from_check: bool) -> bool {
    let (kind, from_check) = (kind.to_string(), from_check.to_string());
    let r = p.call(
        END_TRANSACTION,
        &[
            ("producerGroup", "tg"),
            ("tranStateTableOffset", q),
            ("commitLogOffset", log),
            ("commitOrRollback", &kind),
            ("fromTransactionCheck", &from_check),
        ],
        b"",
    );
    r.code == SUCCESS
}

/// Answers a check-back by the rule; returns its key.
fn answer(p: &mut Client, r: &RemotingCommand) -> String {
    assert_eq!(r.code, CHECK_TRANSACTION_STATE);
    let m = records(&r.body).remove(0);
    let key = m.property("UNIQ_KEY").unwrap().to_string();
    let log = r.field("commitLogOffset").unwrap().to_string();
    let q = r.field("tranStateTableOffset").unwrap().to_string();
    end(p, &log, &q, rule(&key), true);
    key
}

#[test]
fn transaction_crash_child() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return; // only as the crash test's child
    };
    let acks = std::env::var(ACKS_ENV).unwrap();
    let cycle = std::env::var(CYCLE_ENV).unwrap();
    let mut log = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(acks)
        .unwrap();
    let node = start(Path::new(&dir));
    let mut p = producer(&node);
    for i in 0u64.. {
        let key = format!("c{cycle}-{i}");
        let props = [("TRAN_MSG", "true"), ("PGROUP", "tg"), ("UNIQ_KEY", &key)];
        let q = (i % QUEUES as u64) as i32;
        let r = send(&mut p, "tg", "Tx", q, key.as_bytes(), &props, 4);
        assert_eq!(r.code, SUCCESS, "{:?}", r.remark);
        log.write_all(format!("H {key}\n").as_bytes()).unwrap();
        if i % 3 != 2 {
            let at = offset_of(r.field("msgId").unwrap()).to_string();
            if end(
                &mut p,
                &at,
                r.field("queueOffset").unwrap(),
                rule(&key),
                false,
            ) {
                log.write_all(format!("D {key}\n").as_bytes()).unwrap();
            }
        }
        while let Some(c) = p.incoming.pop_front() {
            answer(&mut p, &c);
        }
    }
}

#[test]
fn transactions_survive_kill_9() {
    let seed = seed_from_env("COREMQ_TX_SEED");
    let mut rng = Rng::new(seed);
    let cycles: u64 = std::env::var("COREMQ_TX_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let dir = tempfile::tempdir().unwrap();
    let acks = dir.path().join("acks");
    let data = dir.path().join("data");
    let mut halves = BTreeSet::new();
    let mut decided = BTreeSet::new();
    let mut checks = 0u64;
    let mut committed_total = BTreeMap::new();
    for cycle in 0..cycles {
        let log = dir.path().join(format!("child-{cycle}.log"));
        let mut child = spawn_self(
            "transaction_crash_child",
            &[
                (CHILD_ENV, OsString::from(&data)),
                (ACKS_ENV, OsString::from(&acks)),
                (CYCLE_ENV, OsString::from(cycle.to_string())),
            ],
            &log,
        );
        std::thread::sleep(Duration::from_millis(rng.range(600, 2500)));
        assert!(
            child.try_wait().unwrap().is_none(),
            "the child ended on its own: {}",
            log_tail(&log, 3000)
        );
        child.kill().unwrap();
        child.wait().unwrap();
        for line in std::fs::read_to_string(&acks).unwrap_or_default().lines() {
            match line.split_once(' ') {
                Some(("H", k)) => {
                    halves.insert(k.to_string());
                }
                Some(("D", k)) => {
                    decided.insert(k.to_string());
                }
                _ => {} // a line the kill cut
            }
        }
        // Serve the directory and answer every check-back until all is decided.
        let node = start(&data);
        let mut p = producer(&node);
        let mut c = Client::connect(node.broker_addr);
        let want: BTreeSet<&String> = halves.iter().filter(|k| rule(k) == 8).collect();
        let began = Instant::now();
        let mut quiet_since = Instant::now();
        let committed = loop {
            assert!(
                began.elapsed() < Duration::from_secs(60),
                "cycle {cycle}: not all decided in 60 s"
            );
            if let Some(r) = p.next_incoming(Duration::from_millis(50)) {
                let key = answer(&mut p, &r);
                assert!(
                    !decided.contains(&key),
                    "cycle {cycle}: {key} was decided (acknowledged) but checked back"
                );
                checks += 1;
                quiet_since = Instant::now();
                continue;
            }
            if quiet_since.elapsed() < Duration::from_millis(3 * TIMEOUT_MS + 200) {
                continue;
            }
            let mut counts: BTreeMap<String, u32> = BTreeMap::new();
            for q in 0..QUEUES {
                for m in read_queue(&mut c, "c", "Tx", q, 0) {
                    *counts
                        .entry(m.property("UNIQ_KEY").unwrap().to_string())
                        .or_default() += 1;
                }
            }
            if want.iter().all(|k| counts.contains_key(*k)) {
                break counts;
            }
        };
        for k in committed.keys() {
            assert_eq!(
                rule(k),
                8,
                "cycle {cycle}: {k} was rolled back but delivered"
            );
        }
        committed_total = committed;
        drop((p, c));
        node.shutdown().unwrap();
    }
    let duplicates: u32 = committed_total.values().map(|n| n - 1).sum();
    assert!(
        duplicates as u64 <= 2 * cycles,
        "{duplicates} duplicates in {cycles} kills: {:?}",
        committed_total
            .iter()
            .filter(|(_, n)| **n > 1)
            .collect::<Vec<_>>()
    );
    let rolled_back = halves.iter().filter(|k| rule(k) == 12).count();
    println!(
        "cycles={cycles} halves={} committed={} rolled_back={rolled_back} checks={checks} duplicates={duplicates} seed={seed}",
        halves.len(),
        committed_total.len(),
    );
}
