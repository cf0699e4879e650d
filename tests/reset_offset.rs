//! Reset offset by time (issue 19): INVOKE_BROKER_TO_RESET_OFFSET (222) over the wire,
//! as `resetOffsetByTime` sends it. Proves: the offset for a store time is the first
//! message stored at or after it; without `isForce` only roll-backs are taken, with it
//! any target; a negative timestamp means the queue's end; RocketMQ 5's single-queue
//! reset with an exact offset (checked against the queue's bounds); the committed
//! offsets change (QUERY_CONSUMER_OFFSET reads them back); the answer is a
//! `ResetOffsetBody`; an online consumer is sent RESET_CONSUMER_CLIENT_OFFSET (220) with
//! the table (the list form for a CPP client); unknown topics and groups are refused.
#![cfg(feature = "node")]

#[path = "common/remoting.rs"]
mod remoting;

use coremq::node::remoting::RemotingCommand;
use coremq::node::remoting::codes::*;
use coremq::node::{Network, Node};
use remoting::Client;
use serde_json::Value;
use std::path::Path;
use std::time::Duration;

fn start(dir: &Path, network: Network) -> Node {
    remoting::start_node(dir, network)
}

fn send(c: &mut Client, q: i32) {
    let q = q.to_string();
    c.ok(
        SEND_MESSAGE,
        &[
            ("producerGroup", "pg"),
            ("topic", "T"),
            ("defaultTopic", "TBW102"),
            ("defaultTopicQueueNums", "4"),
            ("queueId", &q),
            ("sysFlag", "0"),
            ("bornTimestamp", "1700000000000"),
            ("flag", "0"),
            ("properties", ""),
            ("reconsumeTimes", "0"),
        ],
        b"body",
    );
}

fn commit(c: &mut Client, group: &str, q: i32, offset: u64) {
    let (q, offset) = (q.to_string(), offset.to_string());
    c.ok(
        UPDATE_CONSUMER_OFFSET,
        &[
            ("consumerGroup", group),
            ("topic", "T"),
            ("queueId", &q),
            ("commitOffset", &offset),
        ],
        b"",
    );
}

fn committed(c: &mut Client, group: &str, q: i32) -> u64 {
    let q = q.to_string();
    let r = c.ok(
        QUERY_CONSUMER_OFFSET,
        &[("consumerGroup", group), ("topic", "T"), ("queueId", &q)],
        b"",
    );
    r.field("offset").unwrap().parse().unwrap()
}

fn reset(
    c: &mut Client,
    group: &str,
    ts: i64,
    force: bool,
    extra: &[(&str, &str)],
) -> RemotingCommand {
    let (ts, force) = (ts.to_string(), force.to_string());
    let mut fields = vec![
        ("topic", "T"),
        ("group", group),
        ("timestamp", ts.as_str()),
        ("isForce", force.as_str()),
    ];
    fields.extend_from_slice(extra);
    c.call(INVOKE_BROKER_TO_RESET_OFFSET, &fields, b"")
}

/// The `ResetOffsetBody` of a SUCCESS answer as (queue id, offset) pairs, read from
/// fastjson's object keys.
fn table(r: &RemotingCommand) -> Vec<(i32, u64)> {
    assert_eq!(r.code, SUCCESS, "{:?}", r.remark);
    let text = String::from_utf8(r.body.to_vec()).unwrap();
    let inner = text
        .strip_prefix("{\"offsetTable\":{")
        .and_then(|t| t.strip_suffix("}}"))
        .unwrap_or_else(|| panic!("not a ResetOffsetBody: {text}"));
    let mut out = Vec::new();
    for entry in inner.split(",{").filter(|e| !e.is_empty()) {
        let entry = entry.trim_start_matches('{');
        let (key, offset) = entry.rsplit_once("}:").unwrap();
        let key: Value = serde_json::from_str(&format!("{{{key}}}")).unwrap();
        assert_eq!(key["topic"], "T");
        assert_eq!(key["brokerName"], "coremq-broker-a");
        out.push((
            key["queueId"].as_i64().unwrap() as i32,
            offset.parse().unwrap(),
        ));
    }
    out.sort();
    out
}

fn resets_by_time(network: Network) {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path(), network);
    let mut c = Client::connect(node.broker_addr);
    c.ok(
        UPDATE_AND_CREATE_TOPIC,
        &[
            ("topic", "T"),
            ("readQueueNums", "2"),
            ("writeQueueNums", "2"),
        ],
        b"",
    );
    // Three messages per queue, a gap in store time, two more per queue.
    for _ in 0..3 {
        send(&mut c, 0);
        send(&mut c, 1);
    }
    std::thread::sleep(Duration::from_millis(30));
    let mid = coremq::now_ms();
    std::thread::sleep(Duration::from_millis(30));
    for _ in 0..2 {
        send(&mut c, 0);
        send(&mut c, 1);
    }

    // Refusals: an unknown topic, a group the broker knows nothing of.
    let r = c.call(
        INVOKE_BROKER_TO_RESET_OFFSET,
        &[
            ("topic", "Nope"),
            ("group", "G"),
            ("timestamp", "0"),
            ("isForce", "true"),
        ],
        b"",
    );
    assert_eq!(r.code, TOPIC_NOT_EXIST, "{:?}", r.remark);
    let r = reset(&mut c, "nobody", mid, true, &[]);
    assert_eq!(r.code, SUBSCRIPTION_GROUP_NOT_EXIST, "{:?}", r.remark);

    // Not forced: queue 0 (consumed to 5) rolls back to 3; queue 1 (at 1) stays.
    commit(&mut c, "G", 0, 5);
    commit(&mut c, "G", 1, 1);
    assert_eq!(
        table(&reset(&mut c, "G", mid, false, &[])),
        vec![(0, 3), (1, 1)]
    );
    assert_eq!(
        (committed(&mut c, "G", 0), committed(&mut c, "G", 1)),
        (3, 1)
    );

    // Forced: every queue to the time's offset; -1 (the end) and 0 (the start).
    assert_eq!(
        table(&reset(&mut c, "G", mid, true, &[])),
        vec![(0, 3), (1, 3)]
    );
    assert_eq!(committed(&mut c, "G", 1), 3);
    assert_eq!(
        table(&reset(&mut c, "G", -1, true, &[])),
        vec![(0, 5), (1, 5)]
    );
    assert_eq!(
        table(&reset(&mut c, "G", 0, true, &[])),
        vec![(0, 0), (1, 0)]
    );
    assert_eq!(
        (committed(&mut c, "G", 0), committed(&mut c, "G", 1)),
        (0, 0)
    );
    assert_eq!(
        table(&reset(&mut c, "G", -1, false, &[])),
        vec![(0, 0), (1, 0)],
        "not forced, the end is no roll-back"
    );

    // RocketMQ 5's single queue with an exact offset, checked against the queue.
    let one = reset(&mut c, "G", 0, false, &[("queueId", "1"), ("offset", "4")]);
    assert_eq!(table(&one), vec![(1, 4)]);
    assert_eq!(
        (committed(&mut c, "G", 0), committed(&mut c, "G", 1)),
        (0, 4)
    );
    let r = reset(&mut c, "G", 0, false, &[("queueId", "1"), ("offset", "9")]);
    assert_eq!(r.code, SYSTEM_ERROR, "{:?}", r.remark);
    let r = reset(&mut c, "G", 0, false, &[("queueId", "7")]);
    assert_eq!(r.code, INVALID_PARAMETER, "{:?}", r.remark);

    // Online consumers of the group are told: a Java one with the map form, a CPP
    // one with the list form; a consumer of another group hears nothing.
    let hb = |id: &str, group: &str| {
        serde_json::json!({
            "clientID": id,
            "consumerDataSet": [{"groupName": group, "consumeType": "CONSUME_PASSIVELY",
                "messageModel": "CLUSTERING", "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
                "subscriptionDataSet": [{"topic": "T", "subString": "*", "expressionType": "TAG"}]}],
            "producerDataSet": [],
        })
        .to_string()
    };
    let mut java = Client::connect(node.broker_addr);
    java.ok(HEART_BEAT, &[], hb("java@1", "G").as_bytes());
    let mut cpp = Client::connect(node.broker_addr);
    cpp.language = Some("CPP".into());
    cpp.ok(HEART_BEAT, &[], hb("cpp@1", "G").as_bytes());
    let mut other = Client::connect(node.broker_addr);
    other.ok(HEART_BEAT, &[], hb("other@1", "H").as_bytes());
    let ts = mid.to_string();
    assert_eq!(
        table(&reset(&mut c, "G", mid, true, &[])),
        vec![(0, 3), (1, 3)]
    );
    let pushed = next_of(&mut java, RESET_CONSUMER_CLIENT_OFFSET);
    assert!(pushed.is_oneway());
    assert_eq!(pushed.field("topic"), Some("T"));
    assert_eq!(pushed.field("group"), Some("G"));
    assert_eq!(pushed.field("timestamp"), Some(ts.as_str()));
    assert_eq!(table(&pushed_as_answer(pushed)), vec![(0, 3), (1, 3)]);
    let pushed = next_of(&mut cpp, RESET_CONSUMER_CLIENT_OFFSET);
    let list: Value = serde_json::from_slice(&pushed.body).unwrap();
    let mut got: Vec<(i64, u64)> = list["offsetTable"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            assert_eq!(e["topic"], "T");
            (
                e["queueId"].as_i64().unwrap(),
                e["offset"].as_u64().unwrap(),
            )
        })
        .collect();
    got.sort();
    assert_eq!(got, vec![(0, 3), (1, 3)]);
    while let Some(f) = other.next_incoming(Duration::from_millis(300)) {
        assert_ne!(
            f.code, RESET_CONSUMER_CLIENT_OFFSET,
            "another group was told"
        );
    }
    node.shutdown().unwrap();
}

/// The next request of `code` the broker sent (other notices, such as consumer ids
/// changed, are skipped).
fn next_of(c: &mut Client, code: i32) -> RemotingCommand {
    loop {
        let f = c
            .next_incoming(Duration::from_secs(5))
            .unwrap_or_else(|| panic!("no request {code} from the broker"));
        if f.code == code {
            return f;
        }
    }
}

/// A pushed request's body read by [`table`].
fn pushed_as_answer(mut f: RemotingCommand) -> RemotingCommand {
    f.code = SUCCESS;
    f
}

#[test]
fn resets_by_time_shards() {
    resets_by_time(Network::Shards);
}

#[test]
fn resets_by_time_threads() {
    resets_by_time(Network::Threads);
}
