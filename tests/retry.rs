//! Consumer retries with back-off and dead letters over the node's protocol
//! (CONSUMER_SEND_MSG_BACK, 36; RocketMQ's `consumerSendMsgBack`), with a short delay
//! table (level k = k x 150 ms) so the back-off is seen in a second: a message sent
//! back `n` times comes back in `%RETRY%group` after level `3 + n`'s delay, never
//! sooner; the level a consumer asks for wins; after `maxReconsumeTimes` failures, or
//! with a negative level, it goes to `%DLQ%group` at once.
#![cfg(feature = "node")]
#[path = "common/remoting.rs"]
mod remoting;

use coremq::node::remoting::RemotingCommand;
use coremq::node::remoting::codes::*;
use coremq::node::{Network, Node, NodeConfig};
use coremq::{ShardedConfig, StoreConfig};
use remoting::*;
use std::path::Path;
use std::time::{Duration, Instant};

const STEP_MS: u64 = 150;

/// A delay runs from the message's store timestamp, which RocketMQ keeps in whole
/// milliseconds (truncated): a delivery may come up to 1 ms before the delay has passed
/// on the test's clock, which started before the send (seen: 299.4 ms for 300 ms).
const STAMP_SLACK: Duration = Duration::from_millis(1);

fn start(dir: &Path) -> Node {
    let levels: Vec<String> = (1..=18).map(|k| format!("{}ms", k * STEP_MS)).collect();
    let cfg = NodeConfig {
        network: Network::Shards,
        data_dir: dir.to_path_buf(),
        listen: "127.0.0.1:0".parse().unwrap(),
        namesrv_enable: false,
        metrics_enable: false,
        shards: 2,
        pin: false,
        message_delay_level: levels.join(" "),
        ..NodeConfig::default()
    };
    let mut store = ShardedConfig::new(dir);
    store.shards = 2;
    store.pin = false;
    store.io_memory_bytes = 8 << 20;
    store.store = StoreConfig::small_for_tests(dir);
    Node::start_with_store(cfg, store).expect("node starts")
}

fn send_back(c: &mut Client, offset: i64, level: i32, max: i32) -> RemotingCommand {
    let (offset, level, max) = (offset.to_string(), level.to_string(), max.to_string());
    c.call(
        CONSUMER_SEND_MSG_BACK,
        &[
            ("offset", &offset),
            ("group", "g"),
            ("delayLevel", &level),
            ("maxReconsumeTimes", &max),
        ],
        b"",
    )
}

/// Waits for the message at `q_offset` of `topic` queue 0; returns it and how long
/// after `since` it became visible.
fn wait_visible(
    c: &mut Client,
    topic: &str,
    q_offset: u64,
    since: Instant,
) -> (coremq::StoredMessage, Duration) {
    loop {
        let r = pull(c, "g", topic, 0, q_offset, 0);
        if r.code == SUCCESS {
            return (records(&r.body).remove(0), since.elapsed());
        }
        assert!(
            since.elapsed() < Duration::from_secs(15),
            "{topic}@{q_offset} never came"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn sent_back_messages_come_back_after_growing_delays_then_go_to_the_dlq() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path());
    let mut c = Client::connect(node.broker_addr);
    let r = send(&mut c, "pg", "Work", 0, b"job", &[("UNIQ_KEY", "JOB1")], 0);
    assert_eq!(r.code, SUCCESS, "{:?}", r.remark);
    let mut offset = offset_of(r.field("msgId").unwrap());
    // Three failures with the broker choosing the level: 3, 4, 5 (450, 600, 750 ms).
    for n in 0..3u64 {
        let since = Instant::now();
        let r = send_back(&mut c, offset, 0, 3);
        assert_eq!(r.code, SUCCESS, "{:?}", r.remark);
        let (m, took) = wait_visible(&mut c, "%RETRY%g", n, since);
        let delay = Duration::from_millis((3 + n) * STEP_MS);
        assert!(
            took + STAMP_SLACK >= delay,
            "retry {n} came after {took:?}, before its {delay:?}"
        );
        assert!(
            took < delay + Duration::from_secs(3),
            "retry {n} took {took:?}"
        );
        assert_eq!(m.reconsume_times, n as i32 + 1);
        assert_eq!(m.property("DELAY"), Some((3 + n).to_string().as_str()));
        assert_eq!(m.property("RETRY_TOPIC"), Some("Work"));
        assert_eq!(m.property("UNIQ_KEY"), Some("JOB1"));
        eprintln!(
            "retry {n}: level {} ({delay:?}) visible after {took:?}",
            3 + n
        );
        offset = m.log_offset as i64;
    }
    // The fourth failure: reconsumed 3 times = maxReconsumeTimes: dead letter, at once.
    let since = Instant::now();
    assert_eq!(send_back(&mut c, offset, 0, 3).code, SUCCESS);
    let (m, took) = wait_visible(&mut c, "%DLQ%g", 0, since);
    assert!(took < Duration::from_millis(STEP_MS * 3), "{took:?}");
    assert_eq!(m.reconsume_times, 4);
    assert_eq!(m.property("RETRY_TOPIC"), Some("Work"));
    // Nothing more in the retry queue.
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(read_queue(&mut c, "g", "%RETRY%g", 0, 0).len(), 3);

    // The consumer's own level wins; a negative one sends it to the DLQ at once.
    let r = send(&mut c, "pg", "Work", 1, b"other", &[], 0);
    let other = offset_of(r.field("msgId").unwrap());
    let since = Instant::now();
    assert_eq!(send_back(&mut c, other, 1, 16).code, SUCCESS);
    let (m, took) = wait_visible(&mut c, "%RETRY%g", 3, since);
    assert!(
        took + STAMP_SLACK >= Duration::from_millis(STEP_MS),
        "{took:?}"
    );
    assert_eq!(m.property("DELAY"), Some("1"));
    assert_eq!(send_back(&mut c, other, -1, 16).code, SUCCESS);
    let (m, _) = wait_visible(&mut c, "%DLQ%g", 1, Instant::now());
    assert_eq!(m.body.as_ref(), b"other");
    node.shutdown().unwrap();
}

/// A pull held on the retry queue is answered when the retry is delivered there (the
/// store tells the node, as RocketMQ's `MessageArrivingListener`), not at the hold's
/// next once-a-second look.
#[test]
fn a_held_pull_wakes_when_the_retry_is_delivered() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path());
    let mut c = Client::connect(node.broker_addr);
    let r = send(&mut c, "pg", "Work", 0, b"job", &[], 0);
    let offset = offset_of(r.field("msgId").unwrap());
    // Create the retry topic's queue first so the pull below is held, not refused.
    let warm = send(&mut c, "pg", "Work", 0, b"warm", &[], 0);
    assert_eq!(
        send_back(&mut c, offset_of(warm.field("msgId").unwrap()), -1, 16).code,
        SUCCESS
    );
    for _ in 0..3 {
        let since = Instant::now();
        assert_eq!(send_back(&mut c, offset, 2, 16).code, SUCCESS);
        let n = read_queue(&mut c, "g", "%RETRY%g", 0, 0).len() as u64;
        let r = pull(&mut c, "g", "%RETRY%g", 0, n, 5000);
        let took = since.elapsed();
        assert_eq!(r.code, SUCCESS, "{:?}", r.remark);
        assert_eq!(records(&r.body)[0].body.as_ref(), b"job");
        assert!(
            took + STAMP_SLACK >= Duration::from_millis(2 * STEP_MS),
            "{took:?}"
        );
        assert!(
            took < Duration::from_millis(2 * STEP_MS + 500),
            "the held pull answered {took:?} after the send-back: not woken by the delivery"
        );
        eprintln!("held pull answered {took:?} after the send-back (level 2 = 300 ms)");
    }
    node.shutdown().unwrap();
}
