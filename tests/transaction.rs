//! Transactions over the node's protocol, with a raw remoting client playing a
//! transactional producer (RocketMQ's `TransactionMQProducer` sends the same frames):
//! a half message is invisible until END_TRANSACTION (37) commits it; a rollback
//! never shows; an "unknown" is checked back (CHECK_TRANSACTION_STATE, 39, over the
//! producer's own connection) no sooner than the transaction timeout and committed
//! from the check; one never answered is checked `transaction_check_max` times, then
//! discarded to TRANS_CHECK_MAX_TIME_TOPIC; a decided message is never asked about,
//! also after a restart, and a half message left pending across a restart is asked
//! about after it. Both front ends.
#![cfg(feature = "node")]
#[path = "common/remoting.rs"]
mod remoting;

use coremq::StoredMessage;
use coremq::node::remoting::RemotingCommand;
use coremq::node::remoting::codes::*;
use coremq::node::{Network, Node, NodeConfig};
use coremq::{ShardedConfig, StoreConfig};
use remoting::*;
use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

const TIMEOUT_MS: u64 = 400;
const CHECK_MAX: u32 = 2;

fn start(dir: &Path, network: Network) -> Node {
    let cfg = NodeConfig {
        network,
        data_dir: dir.to_path_buf(),
        listen: "127.0.0.1:0".parse().unwrap(),
        namesrv_enable: false,
        metrics_enable: false,
        shards: 2,
        pin: false,
        transaction_timeout_ms: TIMEOUT_MS,
        transaction_check_interval_ms: 50,
        transaction_check_max: CHECK_MAX,
        ..NodeConfig::default()
    };
    let mut store = ShardedConfig::new(dir);
    store.shards = 2;
    store.pin = false;
    store.io_memory_bytes = 8 << 20;
    store.store = StoreConfig::small_for_tests(dir);
    Node::start_with_store(cfg, store).expect("node starts")
}

fn producer(node: &Node) -> Client {
    let mut p = Client::connect(node.broker_addr);
    let body = br#"{"clientID":"p1","producerDataSet":[{"groupName":"tg"}],"consumerDataSet":[]}"#;
    let r = p.call(HEART_BEAT, &[], body);
    assert_eq!(r.code, SUCCESS, "{:?}", r.remark);
    p
}

/// A half message `key` to Tx queue 1; returns (commitLogOffset, tranStateTableOffset).
fn half(p: &mut Client, key: &str) -> (String, String) {
    let props = [("TRAN_MSG", "true"), ("PGROUP", "tg"), ("UNIQ_KEY", key)];
    let r = send(p, "tg", "Tx", 1, key.as_bytes(), &props, 4);
    assert_eq!(r.code, SUCCESS, "{:?}", r.remark);
    let log = offset_of(r.field("msgId").unwrap()).to_string();
    (log, r.field("queueOffset").unwrap().to_string())
}

/// END_TRANSACTION, one-way as clients send it.
fn end(p: &mut Client, (log, q): &(String, String), kind: i32, key: &str, from_check: bool) {
    let (kind, from_check) = (kind.to_string(), from_check.to_string());
    p.oneway(
        END_TRANSACTION,
        &[
            ("producerGroup", "tg"),
            ("tranStateTableOffset", q),
            ("commitLogOffset", log),
            ("commitOrRollback", &kind),
            ("fromTransactionCheck", &from_check),
            ("msgId", key),
            ("transactionId", key),
        ],
        b"",
    );
}

fn visible(c: &mut Client) -> Vec<StoredMessage> {
    read_queue(c, "c", "Tx", 1, 0)
}

/// Waits until `pred` holds on Tx queue 1.
fn wait_tx(c: &mut Client, what: &str, pred: impl Fn(&[StoredMessage]) -> bool) {
    let start = Instant::now();
    while !pred(&visible(c)) {
        assert!(start.elapsed() < Duration::from_secs(10), "{what}: never");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn keys(ms: &[StoredMessage]) -> Vec<String> {
    ms.iter()
        .map(|m| m.property("UNIQ_KEY").unwrap_or("").to_string())
        .collect()
}

/// The check-back's (commitLogOffset, tranStateTableOffset) and message.
fn check_of(r: &RemotingCommand) -> ((String, String), StoredMessage) {
    assert_eq!(r.code, CHECK_TRANSACTION_STATE);
    let m = records(&r.body).remove(0);
    let log = r.field("commitLogOffset").unwrap().to_string();
    let q = r.field("tranStateTableOffset").unwrap().to_string();
    assert_eq!(r.field("transactionId"), m.property("UNIQ_KEY"));
    ((log, q), m)
}

fn transactions(network: Network) {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path(), network);
    let mut p = producer(&node);
    let mut c = Client::connect(node.broker_addr);

    // Commit: invisible until END_TRANSACTION, then in its real queue as RocketMQ
    // writes it.
    let k1 = half(&mut p, "K1");
    std::thread::sleep(Duration::from_millis(100));
    assert!(visible(&mut c).is_empty(), "a half message is not visible");
    end(&mut p, &k1, 8, "K1", false);
    wait_tx(&mut c, "commit K1", |v| keys(v) == ["K1"]);
    let m = visible(&mut c).remove(0);
    assert_eq!(m.body.as_ref(), b"K1");
    assert_eq!(m.sys_flag & 0xC, 8, "committed sysFlag");
    assert_eq!(m.prepared_transaction_offset.to_string(), k1.0);
    for gone in ["TRAN_MSG", "REAL_TOPIC", "REAL_QID"] {
        assert_eq!(m.property(gone), None, "{gone}");
    }

    // Rollback; unknown (checked back later); and one never answered.
    let sent = Instant::now();
    let k2 = half(&mut p, "K2");
    end(&mut p, &k2, 12, "K2", false);
    let k3 = half(&mut p, "K3");
    end(&mut p, &k3, 0, "K3", false);
    half(&mut p, "K4");

    // Check-backs arrive over the producer's connection; K3 is committed from its
    // check, K4 is never answered.
    let mut checks: HashMap<String, u32> = HashMap::new();
    let mut discarded = Vec::new();
    let began = Instant::now();
    while discarded.is_empty() {
        assert!(
            began.elapsed() < Duration::from_secs(15),
            "K4 never discarded"
        );
        if let Some(r) = p.next_incoming(Duration::from_millis(20)) {
            let (at, m) = check_of(&r);
            let key = m.property("UNIQ_KEY").unwrap().to_string();
            *checks.entry(key.clone()).or_default() += 1;
            assert!(
                key == "K3" || key == "K4",
                "decided message {key} was checked back"
            );
            assert!(
                sent.elapsed() >= Duration::from_millis(TIMEOUT_MS),
                "{key} checked back before the timeout"
            );
            if key == "K3" {
                end(&mut p, &at, 8, "K3", true);
            }
        }
        discarded = read_queue(&mut c, "c", "TRANS_CHECK_MAX_TIME_TOPIC", 0, 0);
    }
    assert_eq!(checks.get("K3"), Some(&1), "{checks:?}");
    assert_eq!(checks.get("K4"), Some(&CHECK_MAX), "{checks:?}");
    assert_eq!(keys(&discarded), ["K4"]);
    assert_eq!(discarded[0].property("REAL_TOPIC"), Some("Tx"));
    wait_tx(&mut c, "commit K3 from its check", |v| {
        keys(v) == ["K1", "K3"]
    });

    // Nothing more is asked; K2 never shows.
    assert!(
        p.next_incoming(Duration::from_millis(3 * TIMEOUT_MS))
            .is_none(),
        "a decided or discarded message was checked again"
    );
    assert_eq!(keys(&visible(&mut c)), ["K1", "K3"]);

    // A half message pending across a restart is asked about after it; the decided
    // ones are not.
    let k5 = half(&mut p, "K5");
    drop((p, c));
    node.shutdown().unwrap();
    let node = start(dir.path(), network);
    let mut p = producer(&node);
    let mut c = Client::connect(node.broker_addr);
    let r = p
        .next_incoming(Duration::from_secs(10))
        .expect("K5 checked back after the restart");
    let (at, m) = check_of(&r);
    assert_eq!(m.property("UNIQ_KEY"), Some("K5"));
    assert_ne!(at, k5, "asked about the put-back copy");
    end(&mut p, &at, 12, "K5", true);
    assert!(
        p.next_incoming(Duration::from_millis(3 * TIMEOUT_MS))
            .is_none(),
        "a decided message was checked again after the restart"
    );
    assert_eq!(keys(&visible(&mut c)), ["K1", "K3"]);
    assert_eq!(
        read_queue(&mut c, "c", "TRANS_CHECK_MAX_TIME_TOPIC", 0, 0).len(),
        1
    );
    node.shutdown().unwrap();
}

#[test]
fn commit_rollback_check_back_and_discard_on_shards() {
    transactions(Network::Shards);
}

#[test]
fn commit_rollback_check_back_and_discard_on_threads() {
    transactions(Network::Threads);
}

/// END_TRANSACTION refuses what does not name a half message of its group.
#[test]
fn end_transaction_checks_what_it_decides() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path(), Network::Shards);
    let mut p = producer(&node);
    let plain = send(&mut p, "tg", "Tx", 1, b"plain", &[], 0);
    let plain_log = offset_of(plain.field("msgId").unwrap()).to_string();
    let k = half(&mut p, "K9");
    let call = |p: &mut Client, group: &str, log: &str, q: &str, kind: &str| {
        p.call(
            END_TRANSACTION,
            &[
                ("producerGroup", group),
                ("tranStateTableOffset", q),
                ("commitLogOffset", log),
                ("commitOrRollback", kind),
                ("fromTransactionCheck", "false"),
            ],
            b"",
        )
    };
    for (group, log, q, kind, says) in [
        ("other", k.0.as_str(), k.1.as_str(), "8", "producer group"),
        ("tg", k.0.as_str(), "99", "8", "queue offset"),
        ("tg", plain_log.as_str(), "0", "8", "not a half message"),
        ("tg", "123456789", "0", "8", "half message"),
        ("tg", k.0.as_str(), k.1.as_str(), "5", "commitOrRollback"),
    ] {
        let r = call(&mut p, group, log, q, kind);
        assert_eq!(r.code, SYSTEM_ERROR, "{group} {log} {q} {kind}");
        let remark = r.remark.unwrap_or_default();
        assert!(remark.contains(says), "{remark}");
    }
    // Still undecided: a proper commit works.
    let r = call(&mut p, "tg", &k.0, &k.1, "8");
    assert_eq!(r.code, SUCCESS, "{:?}", r.remark);
    let mut c = Client::connect(node.broker_addr);
    wait_tx(&mut c, "commit K9", |v| keys(v).contains(&"K9".to_string()));
    node.shutdown().unwrap();
}
