//! Sends the node cannot honour are refused with a clear error and store nothing,
//! never accepted and lost: a timed message while the timer is switched off, one due
//! further ahead than the maximum, a
//! transactional half message (sysFlag prepared, or `TRAN_MSG` true) under
//! `reject_transaction_message`, and a batch holding a half message (always). Proof
//! that nothing was stored: the next plain message lands right after the previous one
//! in the log and in its queue.
#![cfg(feature = "node")]
#[path = "common/remoting.rs"]
mod remoting;

use coremq::node::remoting::codes::*;
use coremq::node::{Network, Node, NodeConfig};
use coremq::{ShardedConfig, StoreConfig};
use remoting::*;
use std::path::Path;

fn start(dir: &Path) -> Node {
    let cfg = NodeConfig {
        network: Network::Shards,
        data_dir: dir.to_path_buf(),
        listen: "127.0.0.1:0".parse().unwrap(),
        namesrv_enable: false,
        metrics_enable: false,
        shards: 1,
        pin: false,
        reject_transaction_message: true,
        timer_enable: false,
        ..NodeConfig::default()
    };
    let mut store = ShardedConfig::new(dir);
    store.shards = 1;
    store.pin = false;
    store.io_memory_bytes = 8 << 20;
    store.store = StoreConfig::small_for_tests(dir);
    Node::start_with_store(cfg, store).expect("node starts")
}

/// A batch body (RocketMQ's `MessageDecoder.encodeMessages`) of `(body, properties)`.
fn batch(msgs: &[(&[u8], &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (body, props) in msgs {
        let size = 20 + body.len() + 2 + props.len();
        out.extend_from_slice(&(size as i32).to_be_bytes());
        out.extend_from_slice(&[0; 12]); // magic, body CRC, flag
        out.extend_from_slice(&(body.len() as i32).to_be_bytes());
        out.extend_from_slice(body);
        out.extend_from_slice(&(props.len() as i16).to_be_bytes());
        out.extend_from_slice(props.as_bytes());
    }
    out
}

/// The messages of T queue 0 from `from`, once there are any (a put is answered
/// before its queue entry is dispatched).
fn wait_queue(c: &mut Client, from: u64) -> Vec<coremq::StoredMessage> {
    let start = std::time::Instant::now();
    loop {
        let got = read_queue(c, "g", "T", 0, from);
        if !got.is_empty() || start.elapsed() > std::time::Duration::from_secs(10) {
            return got;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn half_and_timed_messages_are_refused_and_nothing_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path());
    let mut c = Client::connect(node.broker_addr);
    let r = send(&mut c, "pg", "T", 0, b"first", &[], 0);
    assert_eq!(r.code, SUCCESS, "{:?}", r.remark);
    let mut last = wait_queue(&mut c, 0).pop().unwrap();

    let future = (coremq::now_ms() + 60_000).to_string();
    type Case<'a> = (i32, Vec<(&'a str, &'a str)>, i32);
    let refused: Vec<Case> = vec![
        (4, vec![], NO_PERMISSION), // sysFlag TRANSACTION_PREPARED
        (0, vec![("TRAN_MSG", "true")], NO_PERMISSION),
        (
            0,
            vec![("TRAN_MSG", "TRUE"), ("PGROUP", "pg")],
            NO_PERMISSION,
        ),
        (0, vec![("TIMER_DELIVER_MS", &future)], MESSAGE_ILLEGAL),
        (0, vec![("TIMER_DELAY_SEC", "30")], MESSAGE_ILLEGAL),
        (0, vec![("TIMER_DELAY_MS", "5000")], MESSAGE_ILLEGAL),
        (0, vec![("__STARTDELIVERTIME", &future)], MESSAGE_ILLEGAL),
    ];
    for (i, (sys_flag, props, code)) in refused.iter().enumerate() {
        let r = send(&mut c, "pg", "T", 0, b"refused", props, *sys_flag);
        assert_eq!(r.code, *code, "case {i}: {:?}", r.remark);
        let remark = r.remark.unwrap_or_default();
        assert!(remark.contains("nothing was stored"), "case {i}: {remark}");
        if *code == NO_PERMISSION {
            assert!(remark.contains("transaction"), "{remark}");
        } else {
            assert!(remark.contains("timed messages"), "{remark}");
        }
        // The next plain message follows the last one: nothing went in between.
        let r = send(
            &mut c,
            "pg",
            "T",
            0,
            format!("after {i}").as_bytes(),
            &[],
            0,
        );
        assert_eq!(r.code, SUCCESS, "{:?}", r.remark);
        let got = wait_queue(&mut c, last.queue_offset + 1);
        assert_eq!(got.len(), 1, "case {i}");
        assert_eq!(got[0].body.as_ref(), format!("after {i}").as_bytes());
        assert_eq!(
            got[0].log_offset,
            last.log_offset + last.size as u64,
            "case {i}: something was stored in between"
        );
        last = got[0].clone();
    }

    // A batch holding a half message is refused whole.
    let body = batch(&[(b"b0", ""), (b"b1", "TRAN_MSG\u{1}true\u{2}")]);
    let r = c.call(
        SEND_BATCH_MESSAGE,
        &[
            ("producerGroup", "pg"),
            ("topic", "T"),
            ("defaultTopic", "TBW102"),
            ("defaultTopicQueueNums", "4"),
            ("queueId", "0"),
            ("sysFlag", "0"),
            ("bornTimestamp", "1700000000000"),
            ("flag", "0"),
            ("properties", ""),
            ("reconsumeTimes", "0"),
            ("batch", "1"),
        ],
        &body,
    );
    assert_eq!(r.code, MESSAGE_ILLEGAL, "{:?}", r.remark);
    let r = send(&mut c, "pg", "T", 0, b"after batch", &[], 0);
    assert_eq!(r.code, SUCCESS, "{:?}", r.remark);
    let got = wait_queue(&mut c, last.queue_offset + 1);
    assert_eq!(got[0].body.as_ref(), b"after batch", "the batch was stored");
    assert_eq!(got[0].log_offset, last.log_offset + last.size as u64);
    last = got[0].clone();

    // A timed message due already is an ordinary one, delivered at once.
    let past = (coremq::now_ms() - 1000).to_string();
    let r = send(
        &mut c,
        "pg",
        "T",
        0,
        b"due",
        &[("TIMER_DELIVER_MS", &past)],
        0,
    );
    assert_eq!(r.code, SUCCESS, "{:?}", r.remark);
    let got = wait_queue(&mut c, last.queue_offset + 1);
    assert_eq!(got[0].body.as_ref(), b"due");
    node.shutdown().unwrap();
}

/// With the timer on (the default), a delivery time past `timer_max_delay_sec` is
/// refused and nothing is stored; one within it is accepted and stored in the timer
/// queue, not in its real queue.
#[test]
fn a_timed_message_too_far_ahead_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = NodeConfig {
        network: Network::Shards,
        data_dir: dir.path().to_path_buf(),
        listen: "127.0.0.1:0".parse().unwrap(),
        namesrv_enable: false,
        metrics_enable: false,
        shards: 1,
        pin: false,
        timer_max_delay_sec: 60,
        ..NodeConfig::default()
    };
    let mut store = ShardedConfig::new(dir.path());
    store.shards = 1;
    store.pin = false;
    store.io_memory_bytes = 8 << 20;
    store.store = StoreConfig::small_for_tests(dir.path());
    let node = Node::start_with_store(cfg, store).expect("node starts");
    let mut c = Client::connect(node.broker_addr);
    let r = send(&mut c, "pg", "T", 0, b"first", &[], 0);
    assert_eq!(r.code, SUCCESS, "{:?}", r.remark);
    let last = wait_queue(&mut c, 0).pop().unwrap();
    let r = send(
        &mut c,
        "pg",
        "T",
        0,
        b"far",
        &[("TIMER_DELAY_SEC", "61")],
        0,
    );
    assert_eq!(r.code, MESSAGE_ILLEGAL, "{:?}", r.remark);
    let remark = r.remark.unwrap_or_default();
    assert!(remark.contains("timer_max_delay_sec"), "{remark}");
    let r = send(
        &mut c,
        "pg",
        "T",
        0,
        b"near",
        &[("TIMER_DELAY_SEC", "59")],
        0,
    );
    assert_eq!(r.code, SUCCESS, "{:?}", r.remark);
    let r = send(&mut c, "pg", "T", 0, b"plain", &[], 0);
    assert_eq!(r.code, SUCCESS, "{:?}", r.remark);
    let got = wait_queue(&mut c, last.queue_offset + 1);
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0].body.as_ref(),
        b"plain",
        "the timed one waits in the timer queue"
    );
    node.shutdown().unwrap();
}
