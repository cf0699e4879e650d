//! The admin surface over the wire (issue 19): a node on loopback driven by a raw
//! RocketMQ remoting client, as `mqadmin` / `rocketmq-admin-cli` drive a broker:
//! manual deletion (329) and what readers see after it (PULL_OFFSET_MOVED with the
//! next begin offset, min offsets, topic stats 202, runtime info 28 with the store's
//! statistics, `/metrics`), broker config 26/25, delete topic 215, clean unused topics
//! 316, subscription groups 200/201/207, consume stats 208, queue locks 41/42, client
//! config check 46 and the SQL92 refusal; RocketMQ-Rust's list deletes 5002/5003.
#![cfg(feature = "node")]

#[path = "common/remoting.rs"]
mod remoting;

use coremq::node::remoting::RemotingCommand;
use coremq::node::remoting::codes::*;
use coremq::node::{Network, Node, NodeConfig};
use coremq::{Message, ShardedConfig, StoreConfig, StoreOps};
use remoting::Client;
use serde_json::Value;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

fn start(dir: &Path, network: Network) -> Node {
    let cfg = NodeConfig {
        network,
        data_dir: dir.to_path_buf(),
        listen: "127.0.0.1:0".parse().unwrap(),
        namesrv_listen: "127.0.0.1:0".parse().unwrap(),
        metrics_listen: "127.0.0.1:0".parse().unwrap(),
        shards: 2,
        pin: false,
        offset_flush_interval_ms: 100,
        ..NodeConfig::default()
    };
    let mut store = ShardedConfig::new(dir);
    store.shards = 2;
    store.pin = false;
    store.io_memory_bytes = 8 << 20;
    store.store = StoreConfig::small_for_tests(dir);
    store.store.consume_queue_flush_interval = Duration::from_millis(50);
    // Everything is expired at once, but only a manual deletion may delete: no
    // delete_when hour, no background pass, and the host disk's level is ignored.
    let r = &mut store.store.retention;
    r.file_reserved_time = Duration::ZERO;
    r.delete_when = String::new();
    r.clean_interval = Duration::from_secs(3600);
    r.delete_interval = Duration::ZERO;
    r.delete_file_batch_max = 100;
    r.disk_max_used_space_ratio = 1.0;
    r.disk_clean_forcibly_ratio = 1.0;
    store.store.disk_full_ratio = 1.0;
    Node::start_with_store(cfg, store).expect("node starts")
}

fn send(c: &mut Client, topic: &str, q: i32, body: &[u8], key: &str) {
    let props = format!("KEYS\u{1}{key}\u{2}");
    let q = q.to_string();
    c.ok(
        SEND_MESSAGE,
        &[
            ("producerGroup", "pg"),
            ("topic", topic),
            ("defaultTopic", "TBW102"),
            ("defaultTopicQueueNums", "4"),
            ("queueId", &q),
            ("sysFlag", "0"),
            ("bornTimestamp", "1700000000000"),
            ("flag", "0"),
            ("properties", &props),
            ("reconsumeTimes", "0"),
        ],
        body,
    );
}

fn pull(
    c: &mut Client,
    topic: &str,
    q: i32,
    offset: u64,
    extra: &[(&str, &str)],
) -> RemotingCommand {
    let (q, offset) = (q.to_string(), offset.to_string());
    let mut fields = vec![
        ("consumerGroup", "cg"),
        ("topic", topic),
        ("queueId", q.as_str()),
        ("queueOffset", offset.as_str()),
        ("maxMsgNums", "32"),
        ("sysFlag", "0"),
        ("commitOffset", "0"),
        ("suspendTimeoutMillis", "0"),
        ("subscription", "*"),
        ("subVersion", "0"),
    ];
    fields.extend_from_slice(extra);
    c.call(PULL_MESSAGE, &fields, b"")
}

fn json(r: &RemotingCommand) -> Value {
    serde_json::from_slice(&r.body).unwrap_or_else(|e| {
        panic!(
            "body is not JSON ({e}): {}",
            String::from_utf8_lossy(&r.body)
        )
    })
}

fn field_num(r: &RemotingCommand, name: &str) -> u64 {
    r.field(name)
        .unwrap_or_else(|| panic!("no {name} in {:?}", r.ext_fields))
        .parse()
        .unwrap()
}

fn metrics_text(node: &Node) -> String {
    let mut m = TcpStream::connect(node.metrics_addr.unwrap()).unwrap();
    m.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut text = String::new();
    m.read_to_string(&mut text).unwrap();
    text
}

/// Sum of a metric's samples whose line starts with `prefix`.
fn metric_sum(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn manual_deletion_and_what_readers_see_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path(), Network::Shards);
    let mut c = Client::connect(node.broker_addr);
    c.ok(
        UPDATE_AND_CREATE_TOPIC,
        &[
            ("topic", "T"),
            ("readQueueNums", "1"),
            ("writeQueueNums", "1"),
        ],
        b"",
    );
    // ~3.5 MiB into one queue: 1 MiB segments, so at least two can go.
    let body = vec![b'x'; 30_000];
    let n = 120;
    for i in 0..n {
        send(&mut c, "T", 0, &body, &format!("k{i}"));
    }
    // The retention limit is the last checkpoint: wait for one past the old data.
    std::thread::sleep(Duration::from_millis(400));
    let t0 = Instant::now();
    let removed = loop {
        let r = c.ok(DELETE_EXPIRED_COMMITLOG, &[], b"");
        let remark = r.remark.clone().unwrap_or_default();
        let segs: u64 = remark
            .strip_prefix("deleted ")
            .and_then(|s| s.split(' ').next())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("remark {remark:?}"));
        if segs >= 2 || t0.elapsed() > Duration::from_secs(20) {
            break segs;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(removed >= 2, "manual deletion removed {removed} segments");
    let min = field_num(
        &c.ok(GET_MIN_OFFSET, &[("topic", "T"), ("queueId", "0")], b""),
        "offset",
    );
    let max = field_num(
        &c.ok(GET_MAX_OFFSET, &[("topic", "T"), ("queueId", "0")], b""),
        "offset",
    );
    assert!(min > 0 && max == n, "min {min} max {max}");
    // A pull below the minimum: PULL_OFFSET_MOVED to the minimum (RocketMQ's
    // OFFSET_TOO_SMALL); at the minimum: messages.
    let r = pull(&mut c, "T", 0, 0, &[]);
    assert_eq!(r.code, PULL_OFFSET_MOVED, "{:?}", r.remark);
    assert_eq!(field_num(&r, "nextBeginOffset"), min);
    let r = pull(&mut c, "T", 0, min, &[]);
    assert_eq!(r.code, SUCCESS, "{:?}", r.remark);
    // Key queries never return deleted records, and do return kept ones.
    let deleted_key = "k0".to_string();
    let kept_key = format!("k{}", n - 1);
    for (key, want) in [(deleted_key, 0), (kept_key, 1)] {
        let r = c.call(
            QUERY_MESSAGE,
            &[
                ("topic", "T"),
                ("key", &key),
                ("maxNum", "8"),
                ("beginTimestamp", "0"),
                ("endTimestamp", &i64::MAX.to_string()),
            ],
            b"",
        );
        let got = if r.code == SUCCESS {
            r.body.len().min(1)
        } else {
            0
        };
        assert_eq!(got, want, "key {key}: code {} {:?}", r.code, r.remark);
    }
    // Topic stats (202): the queue's min and max, fastjson MessageQueue keys.
    let r = c.ok(GET_TOPIC_STATS_INFO, &[("topic", "T")], b"");
    let text = String::from_utf8(r.body.to_vec()).unwrap();
    assert!(
        text.contains("\"queueId\":0,\"topic\":\"T\"}:{")
            && text.contains(&format!("\"maxOffset\":{max},\"minOffset\":{min}")),
        "{text}"
    );
    assert_eq!(
        c.call(GET_TOPIC_STATS_INFO, &[("topic", "Nope")], b"").code,
        TOPIC_NOT_EXIST
    );
    // Runtime info (28): RocketMQ's keys, from the store's statistics.
    let info = json(&c.ok(GET_BROKER_RUNTIME_INFO, &[], b""));
    let t = &info["table"];
    assert_eq!(t["msgPutTotalTodayNow"], n.to_string());
    assert_eq!(t["putMessageTimesTotal"], n.to_string());
    for k in [
        "putTps",
        "getTransferredTps",
        "getTransferedTps",
        "putMessageDistributeTime",
        "commitLogDiskRatio",
        "earliestMessageTimeStamp",
    ] {
        assert!(t[k].is_string(), "{k} missing: {t}");
    }
    assert_eq!(t["putTps"].as_str().unwrap().split(' ').count(), 3);
    // Each shard's log starts at its base (shard i: i << 56).
    let moved: u64 = (0..2u64)
        .map(|i| {
            let v = &t[format!("coremq_shard{i}_logMinOffset")];
            v.as_str().unwrap().parse::<u64>().unwrap() - (i << 56)
        })
        .sum();
    assert!(moved >= 2 << 20, "the log minimum moved: {t}");
    // /metrics: the store's counters and the retention's.
    let m = metrics_text(&node);
    assert_eq!(metric_sum(&m, "coremq_store_put_messages_total{"), n as f64);
    assert!(
        metric_sum(&m, "coremq_retention_expired_segments_total{") >= 2.0,
        "{m}"
    );
    assert!(metric_sum(&m, "coremq_store_get_found_total{") >= 1.0);
    assert!(m.contains("coremq_store_put_latency_seconds_bucket{shard=\"0\",le=\"+Inf\"}"));
    node.shutdown().unwrap();
}

#[test]
fn config_topics_groups_locks_and_filters() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path(), Network::Threads);
    let mut c = Client::connect(node.broker_addr);
    // Broker config (26) and a runtime change of a retention key (25).
    let conf = String::from_utf8(c.ok(GET_BROKER_CONFIG, &[], b"").body.to_vec()).unwrap();
    assert!(conf.lines().any(|l| l == "fileReservedTime=0"), "{conf}");
    assert!(conf.lines().any(|l| l == "deleteWhen="), "{conf}");
    c.ok(
        UPDATE_BROKER_CONFIG,
        &[],
        b"deleteWhen=05\nfileReservedTime=48\n",
    );
    let conf = String::from_utf8(c.ok(GET_BROKER_CONFIG, &[], b"").body.to_vec()).unwrap();
    assert!(conf.lines().any(|l| l == "deleteWhen=05"), "{conf}");
    assert!(conf.lines().any(|l| l == "fileReservedTime=48"), "{conf}");
    let r = c.call(UPDATE_BROKER_CONFIG, &[], b"listenPort=1\n");
    assert_eq!(r.code, SYSTEM_ERROR);
    assert!(r.remark.unwrap().contains("listenPort"));
    let r = c.call(UPDATE_BROKER_CONFIG, &[], b"deleteWhen=25\n");
    assert_eq!(r.code, SYSTEM_ERROR, "an hour past 23 is refused");
    assert_eq!(
        c.call(UPDATE_BROKER_CONFIG, &[], b"brokerConfigPath=/x\n")
            .code,
        NO_PERMISSION
    );

    // Delete topic (215): config, offsets and queues go; a system topic is refused.
    send(&mut c, "Gone", 0, b"hello", "kg");
    c.ok(
        UPDATE_CONSUMER_OFFSET,
        &[
            ("consumerGroup", "cg"),
            ("topic", "Gone"),
            ("queueId", "0"),
            ("commitOffset", "1"),
        ],
        b"",
    );
    c.ok(DELETE_TOPIC_IN_BROKER, &[("topic", "Gone")], b"");
    let all = json(&c.ok(GET_ALL_TOPIC_CONFIG, &[], b""));
    assert!(all["topicConfigTable"].get("Gone").is_none());
    let offsets = String::from_utf8(c.ok(GET_ALL_CONSUMER_OFFSET, &[], b"").body.to_vec()).unwrap();
    assert!(!offsets.contains("Gone@cg"), "{offsets}");
    let h = node.handle();
    let (min, max) = futures_lite::future::block_on(h.queue_offsets("Gone", 0)).unwrap();
    assert_eq!((min, max), (0, 0));
    assert_eq!(
        c.call(DELETE_TOPIC_IN_BROKER, &[("topic", "TBW102")], b"")
            .code,
        INVALID_PARAMETER
    );
    c.ok(DELETE_TOPIC_IN_NAMESRV, &[("topic", "Gone")], b"");
    let list = json(&c.ok(GET_ALL_TOPIC_LIST_FROM_NAMESERVER, &[], b""));
    assert!(
        !list["topicList"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t == "Gone")
    );

    // Clean unused topics (316): queues of a topic not in the topic table go.
    let r = futures_lite::future::block_on(h.put(Message::new("Orphan", 0, b"o".to_vec())));
    assert!(r.status.is_stored());
    let r = c.ok(CLEAN_UNUSED_TOPIC, &[], b"");
    assert!(r.remark.unwrap().contains("Orphan"));
    let (_, max) = futures_lite::future::block_on(h.queue_offsets("Orphan", 0)).unwrap();
    assert_eq!(max, 0);

    // Subscription groups (200, 201, 207).
    c.ok(
        UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
        &[],
        br#"{"groupName":"G1","retryMaxTimes":3}"#,
    );
    let groups = json(&c.ok(GET_ALL_SUBSCRIPTIONGROUP_CONFIG, &[], b""));
    assert_eq!(groups["subscriptionGroupTable"]["G1"]["retryMaxTimes"], 3);
    assert_eq!(groups["subscriptionGroupTable"]["G1"]["retryQueueNums"], 1);
    let bad = c.call(
        UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
        &[],
        br#"{"groupName":"a b"}"#,
    );
    assert_eq!(bad.code, INVALID_PARAMETER);
    c.ok(DELETE_SUBSCRIPTIONGROUP, &[("groupName", "G1")], b"");
    let groups = json(&c.ok(GET_ALL_SUBSCRIPTIONGROUP_CONFIG, &[], b""));
    assert!(groups["subscriptionGroupTable"].get("G1").is_none());

    // Consume stats (208): broker offset and the committed offset per read queue.
    c.ok(
        UPDATE_AND_CREATE_TOPIC,
        &[
            ("topic", "S"),
            ("readQueueNums", "2"),
            ("writeQueueNums", "2"),
        ],
        b"",
    );
    for _ in 0..3 {
        send(&mut c, "S", 1, b"m", "ks");
    }
    c.ok(
        UPDATE_CONSUMER_OFFSET,
        &[
            ("consumerGroup", "sg"),
            ("topic", "S"),
            ("queueId", "1"),
            ("commitOffset", "2"),
        ],
        b"",
    );
    // A send is answered once stored; its queue entry follows with dispatch.
    let want = "\"queueId\":1,\"topic\":\"S\"}:{\"brokerOffset\":3,\"consumerOffset\":2,";
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let stats = loop {
        let s = String::from_utf8(
            c.ok(GET_CONSUME_STATS, &[("consumerGroup", "sg")], b"")
                .body
                .to_vec(),
        )
        .unwrap();
        if s.contains(want) || std::time::Instant::now() > deadline {
            break s;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(stats.contains(want), "{stats}");
    assert!(
        stats.contains("\"queueId\":0,\"topic\":\"S\"}:{\"brokerOffset\":0,\"consumerOffset\":0,")
    );

    // Queue locks (41, 42): granted, refused to another client, released by the owner.
    let mq = |q: i32| serde_json::json!({"topic": "S", "brokerName": "b", "queueId": q});
    let body = |client: &str, qs: &[i32]| {
        serde_json::json!({"consumerGroup": "og", "clientId": client, "mqSet": qs.iter().map(|q| mq(*q)).collect::<Vec<_>>()})
            .to_string()
    };
    let granted = |r: &RemotingCommand| json(r)["lockOKMQSet"].as_array().unwrap().len();
    assert_eq!(
        granted(&c.ok(LOCK_BATCH_MQ, &[], body("c1", &[0, 1]).as_bytes())),
        2
    );
    assert_eq!(
        granted(&c.ok(LOCK_BATCH_MQ, &[], body("c2", &[0, 1]).as_bytes())),
        0
    );
    c.ok(UNLOCK_BATCH_MQ, &[], body("c2", &[0]).as_bytes());
    assert_eq!(
        granted(&c.ok(LOCK_BATCH_MQ, &[], body("c2", &[0]).as_bytes())),
        0,
        "c2 cannot unlock c1's"
    );
    c.ok(UNLOCK_BATCH_MQ, &[], body("c1", &[0]).as_bytes());
    assert_eq!(
        granted(&c.ok(LOCK_BATCH_MQ, &[], body("c2", &[0, 1]).as_bytes())),
        1
    );

    // Connection lists (203, 204) from heartbeats; gone after unregistering.
    let hb = serde_json::json!({
        "clientID": "10.0.0.1@c9",
        "consumerDataSet": [{"groupName": "hg", "consumeType": "CONSUME_PASSIVELY",
            "messageModel": "CLUSTERING", "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
            "subscriptionDataSet": [{"topic": "S", "subString": "*", "expressionType": "TAG"}]}],
        "producerDataSet": [{"groupName": "hp"}],
    });
    c.ok(HEART_BEAT, &[], hb.to_string().as_bytes());
    let list = json(&c.ok(
        GET_CONSUMER_CONNECTION_LIST,
        &[("consumerGroup", "hg")],
        b"",
    ));
    assert_eq!(
        list["connectionSet"][0]["clientId"], "10.0.0.1@c9",
        "{list}"
    );
    assert!(
        list["connectionSet"][0]["clientAddr"]
            .as_str()
            .unwrap()
            .starts_with("127.0.0.1:")
    );
    assert_eq!(list["messageModel"], "CLUSTERING");
    assert_eq!(list["subscriptionTable"]["S"]["subString"], "*");
    let prod = json(&c.ok(
        GET_PRODUCER_CONNECTION_LIST,
        &[("producerGroup", "hp")],
        b"",
    ));
    assert_eq!(prod["connectionSet"][0]["clientId"], "10.0.0.1@c9");
    assert_eq!(
        c.call(
            GET_PRODUCER_CONNECTION_LIST,
            &[("producerGroup", "none")],
            b""
        )
        .code,
        SYSTEM_ERROR
    );
    c.ok(
        UNREGISTER_CLIENT,
        &[("clientID", "10.0.0.1@c9"), ("consumerGroup", "hg")],
        b"",
    );
    assert_eq!(
        c.call(
            GET_CONSUMER_CONNECTION_LIST,
            &[("consumerGroup", "hg")],
            b""
        )
        .code,
        CONSUMER_NOT_ONLINE
    );

    // Filters: TAG accepted, SQL92 refused clearly (check and pull).
    let check = |kind: &str| {
        serde_json::json!({"clientId": "c", "group": "g", "subscriptionData": {"topic": "S", "subString": "a > 1", "expressionType": kind}})
            .to_string()
    };
    c.ok(CHECK_CLIENT_CONFIG, &[], check("TAG").as_bytes());
    let r = c.call(CHECK_CLIENT_CONFIG, &[], check("SQL92").as_bytes());
    assert_eq!(r.code, SYSTEM_ERROR);
    assert!(r.remark.unwrap().contains("SQL92"));
    let r = pull(
        &mut c,
        "S",
        1,
        0,
        &[("expressionType", "SQL92"), ("subscription", "a > 1")],
    );
    assert_eq!(r.code, SYSTEM_ERROR);
    assert!(r.remark.unwrap().contains("SQL92"));
    let r = pull(&mut c, "S", 1, 0, &[("expressionType", "TAG")]);
    assert_eq!(r.code, SUCCESS);
    node.shutdown().unwrap();

    // Groups persist; locks do not (RocketMQ's neither).
    let node = start(dir.path(), Network::Threads);
    let mut c = Client::connect(node.broker_addr);
    c.ok(
        UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
        &[],
        br#"{"groupName":"G2"}"#,
    );
    node.shutdown().unwrap();
    let node = start(dir.path(), Network::Threads);
    let mut c = Client::connect(node.broker_addr);
    let groups = json(&c.ok(GET_ALL_SUBSCRIPTIONGROUP_CONFIG, &[], b""));
    assert!(groups["subscriptionGroupTable"].get("G2").is_some());
    node.shutdown().unwrap();
}

/// RocketMQ-Rust's list forms of delete topic (5002) and delete subscription group
/// (5003), which `rocketmq-admin-cli` deleteTopic and deleteSubGroup send.
#[test]
fn list_deletes_of_topics_and_groups() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path(), Network::Threads);
    let mut c = Client::connect(node.broker_addr);
    for t in ["L1", "L2", "Kept"] {
        c.ok(UPDATE_AND_CREATE_TOPIC, &[("topic", t)], b"");
    }
    for g in ["LG1", "LG2"] {
        let body = format!("{{\"groupName\":\"{g}\"}}");
        c.ok(UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, &[], body.as_bytes());
    }
    c.ok(
        UPDATE_CONSUMER_OFFSET,
        &[
            ("consumerGroup", "LG1"),
            ("topic", "Kept"),
            ("queueId", "0"),
            ("commitOffset", "0"),
        ],
        b"",
    );
    let r = c.call(
        DELETE_TOPIC_IN_BROKER_LIST,
        &[],
        br#"{"topicList":["L1","TBW102"]}"#,
    );
    assert_eq!(
        r.code, INVALID_PARAMETER,
        "a system topic refuses the whole list"
    );
    let all = json(&c.ok(GET_ALL_TOPIC_CONFIG, &[], b""));
    assert!(all["topicConfigTable"].get("L1").is_some(), "nothing went");
    c.ok(
        DELETE_TOPIC_IN_BROKER_LIST,
        &[],
        br#"{"topicList":["L1","L2"]}"#,
    );
    let all = json(&c.ok(GET_ALL_TOPIC_CONFIG, &[], b""));
    let table = &all["topicConfigTable"];
    assert!(table.get("L1").is_none() && table.get("L2").is_none() && table.get("Kept").is_some());
    assert_eq!(
        c.call(DELETE_TOPIC_IN_BROKER_LIST, &[], b"[1]").code,
        SYSTEM_ERROR
    );

    c.ok(
        DELETE_SUBSCRIPTIONGROUP_LIST,
        &[],
        br#"{"groupNameList":["LG1","LG2"],"cleanOffset":true}"#,
    );
    let groups = json(&c.ok(GET_ALL_SUBSCRIPTIONGROUP_CONFIG, &[], b""));
    assert_eq!(groups["subscriptionGroupTable"], serde_json::json!({}));
    let offsets = String::from_utf8(c.ok(GET_ALL_CONSUMER_OFFSET, &[], b"").body.to_vec()).unwrap();
    assert!(!offsets.contains("@LG1"), "cleanOffset: {offsets}");
    node.shutdown().unwrap();
}
