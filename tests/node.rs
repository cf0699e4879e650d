//! `coremq serve` over the wire: a node on ephemeral loopback ports, driven by a
//! small blocking RocketMQ remoting client written here.

use bytes::Bytes;
use coremq::StoreOps;
use coremq::node::remoting::codes::*;
use coremq::node::remoting::{RemotingCommand, SerializeType, decode_payload};
use coremq::node::{Network, Node, NodeConfig};
use coremq::{ShardedConfig, StoreConfig, StoredMessage};
use serde_json::Value;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

fn start(dir: &Path, network: Network) -> Node {
    start_with(dir, network, |_| {})
}

fn start_with(dir: &Path, network: Network, tweak: impl FnOnce(&mut NodeConfig)) -> Node {
    let mut cfg = NodeConfig {
        network,
        data_dir: dir.to_path_buf(),
        listen: "127.0.0.1:0".parse().unwrap(),
        namesrv_listen: "127.0.0.1:0".parse().unwrap(),
        metrics_listen: "127.0.0.1:0".parse().unwrap(),
        shards: 2,
        pin: false,
        max_frame_bytes: 1 << 20,
        offset_flush_interval_ms: 100,
        ..NodeConfig::default()
    };
    tweak(&mut cfg);
    let mut store = ShardedConfig::new(dir);
    store.shards = 2;
    store.pin = false;
    store.io_memory_bytes = 8 << 20;
    store.store = StoreConfig::small_for_tests(dir);
    Node::start_with_store(cfg, store).expect("node starts")
}

struct Client {
    s: TcpStream,
    opaque: i32,
}

impl Client {
    fn connect(addr: SocketAddr) -> Client {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        Client { s, opaque: 0 }
    }

    fn send_raw(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).unwrap();
    }

    fn read_response(&mut self) -> std::io::Result<RemotingCommand> {
        let mut len = [0u8; 4];
        self.s.read_exact(&mut len)?;
        let mut payload = vec![0u8; u32::from_be_bytes(len) as usize];
        self.s.read_exact(&mut payload)?;
        Ok(decode_payload(payload.into()).expect("the node sends well-formed frames"))
    }

    fn request(
        &mut self,
        code: i32,
        fields: &[(&str, &str)],
        body: &[u8],
        kind: SerializeType,
    ) -> RemotingCommand {
        self.opaque += 1;
        let mut c = RemotingCommand::request(
            code,
            self.opaque,
            fields
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        c.serialize_type = kind;
        c.body = Bytes::copy_from_slice(body);
        self.send_raw(&c.encode());
        // Requests the broker starts (NOTIFY_CONSUMER_IDS_CHANGED after a heartbeat
        // naming a consumer group) are one-way and skipped here.
        let r = loop {
            let f = self.read_response().expect("a response");
            if f.is_response() {
                break f;
            }
            assert!(
                f.is_oneway(),
                "a broker request to a test client is one-way"
            );
        };
        assert_eq!(r.opaque, self.opaque);
        assert_eq!(r.serialize_type, kind);
        r
    }

    fn call(&mut self, code: i32, fields: &[(&str, &str)], body: &[u8]) -> RemotingCommand {
        self.request(code, fields, body, SerializeType::Json)
    }

    /// Whether the node closed this connection (EOF or reset within a few seconds).
    fn is_closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.s.read(&mut b), Ok(0) | Err(_))
    }
}

fn send(
    c: &mut Client,
    topic: &str,
    q: i32,
    body: &str,
    tags: &str,
    keys: &str,
) -> RemotingCommand {
    let props = format!("TAGS\u{1}{tags}\u{2}KEYS\u{1}{keys}\u{2}");
    let q = q.to_string();
    let r = c.call(
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
        body.as_bytes(),
    );
    assert_eq!(r.code, SUCCESS, "{:?}", r.remark);
    r
}

/// Splits a pull or query body into decoded records.
fn records(body: &[u8]) -> Vec<StoredMessage> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < body.len() {
        let size = u32::from_be_bytes(body[at..at + 4].try_into().unwrap()) as usize;
        let raw = Bytes::copy_from_slice(&body[at..at + size]);
        out.push(StoredMessage::decode(&raw).expect("a valid record"));
        at += size;
    }
    out
}

fn pull(c: &mut Client, topic: &str, q: i32, offset: u64, suspend_ms: u64) -> RemotingCommand {
    let (q, offset, suspend) = (q.to_string(), offset.to_string(), suspend_ms.to_string());
    let sys_flag = if suspend_ms > 0 { "2" } else { "0" };
    c.call(
        PULL_MESSAGE,
        &[
            ("consumerGroup", "cg"),
            ("topic", topic),
            ("queueId", &q),
            ("queueOffset", &offset),
            ("maxMsgNums", "32"),
            ("sysFlag", sys_flag),
            ("commitOffset", "0"),
            ("suspendTimeoutMillis", &suspend),
            ("subscription", "*"),
            ("subVersion", "0"),
        ],
        b"",
    )
}

fn bodies(r: &RemotingCommand) -> Vec<String> {
    records(&r.body)
        .iter()
        .map(|m| String::from_utf8_lossy(&m.body).into_owned())
        .collect()
}

/// RocketMQ's batch body encoding (`MessageDecoder.encodeMessages`).
fn batch_body(msgs: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (body, props) in msgs {
        let size = 4 + 4 + 4 + 4 + 4 + body.len() + 2 + props.len();
        out.extend_from_slice(&(size as i32).to_be_bytes());
        out.extend_from_slice(&0i32.to_be_bytes()); // magic
        out.extend_from_slice(&0i32.to_be_bytes()); // body crc
        out.extend_from_slice(&0i32.to_be_bytes()); // flag
        out.extend_from_slice(&(body.len() as i32).to_be_bytes());
        out.extend_from_slice(body.as_bytes());
        out.extend_from_slice(&(props.len() as i16).to_be_bytes());
        out.extend_from_slice(props.as_bytes());
    }
    out
}

#[test]
fn route_send_pull_offsets_queries_on_shards() {
    route_send_pull_offsets_queries(Network::Shards);
}

#[test]
fn route_send_pull_offsets_queries_on_threads() {
    route_send_pull_offsets_queries(Network::Threads);
}

fn route_send_pull_offsets_queries(network: Network) {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path(), network);
    let broker = node.broker_addr;
    let mut ns = Client::connect(node.namesrv_addr.unwrap());
    let mut c = Client::connect(broker);

    // Route lookup on the name-server port: this node, read/write, default queues.
    let r = ns.call(GET_ROUTEINFO_BY_TOPIC, &[("topic", "Orders")], b"");
    assert_eq!(r.code, SUCCESS, "{:?}", r.remark);
    let route: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(
        route["brokerDatas"][0]["brokerAddrs"]["0"],
        broker.to_string()
    );
    assert_eq!(route["queueDatas"][0]["perm"], 6);
    assert_eq!(route["queueDatas"][0]["writeQueueNums"], 4);
    let r = ns.call(GET_ROUTEINFO_BY_TOPIC, &[("topic", "bad topic!")], b"");
    assert_eq!(r.code, TOPIC_NOT_EXIST);
    let r = ns.call(GET_BROKER_CLUSTER_INFO, &[], b"");
    let info: Value = serde_json::from_slice(&r.body).unwrap();
    assert!(info["clusterAddrTable"]["DefaultCluster"].is_array());

    // Sends: classic header, V2 short names, a batch.
    let first = send(&mut c, "Orders", 1, "m0", "TagA", "k0 shared");
    assert_eq!(first.field("queueOffset"), Some("0"));
    assert_eq!(first.field("queueId"), Some("1"));
    let id0 = first.field("msgId").unwrap().to_string();
    assert_eq!(id0.len(), 32);
    let r = c.call(
        SEND_MESSAGE_V2,
        &[
            ("a", "pg"),
            ("b", "Orders"),
            ("c", "TBW102"),
            ("d", "4"),
            ("e", "1"),
            ("f", "0"),
            ("g", "1700000000001"),
            ("h", "0"),
            ("i", "TAGS\u{1}TagB\u{2}KEYS\u{1}k1\u{2}"),
            ("j", "0"),
        ],
        b"m1",
    );
    assert_eq!(r.code, SUCCESS, "{:?}", r.remark);
    assert_eq!(r.field("queueOffset"), Some("1"));
    let batch = batch_body(&[("m2", "KEYS\u{1}k2\u{2}"), ("m3", "KEYS\u{1}shared\u{2}")]);
    let r = c.call(
        SEND_BATCH_MESSAGE,
        &[("b", "Orders"), ("a", "pg"), ("e", "1"), ("m", "true")],
        &batch,
    );
    assert_eq!(r.code, SUCCESS, "{:?}", r.remark);
    assert_eq!(r.field("queueOffset"), Some("2"));
    assert_eq!(r.field("msgId").unwrap().split(',').count(), 2);
    // Refusals: queue out of range, missing field, empty topic, bad batch.
    let r = c.call(
        SEND_MESSAGE,
        &[("topic", "Orders"), ("queueId", "99")],
        b"x",
    );
    assert_eq!(r.code, SYSTEM_ERROR);
    let r = c.call(SEND_MESSAGE, &[("topic", "Orders")], b"x");
    assert_eq!(r.code, SYSTEM_ERROR);
    assert!(r.remark.unwrap().contains("queueId"));
    let r = c.call(SEND_MESSAGE, &[("topic", ""), ("queueId", "0")], b"x");
    assert_eq!(r.code, MESSAGE_ILLEGAL);
    let r = c.call(
        SEND_BATCH_MESSAGE,
        &[("topic", "Orders"), ("queueId", "1")],
        b"\x00\x00\x00\x05junk",
    );
    assert_eq!(r.code, MESSAGE_ILLEGAL);

    // Pull everything (once dispatched: a pull sees what dispatch has indexed).
    futures_lite::future::block_on(node.handle().wait_dispatched()).unwrap();
    let r = pull(&mut c, "Orders", 1, 0, 2000);
    assert_eq!(r.code, SUCCESS, "{:?}", r.remark);
    assert_eq!(bodies(&r), ["m0", "m1", "m2", "m3"]);
    assert_eq!(r.field("nextBeginOffset"), Some("4"));
    assert_eq!(r.field("maxOffset"), Some("4"));
    let recs = records(&r.body);
    assert_eq!(recs[0].msg_id.unwrap().to_string(), id0);
    assert_eq!(recs[1].property("TAGS"), Some("TagB"));
    // Tag filter.
    let r = c.call(
        PULL_MESSAGE,
        &[
            ("consumerGroup", "cg"),
            ("topic", "Orders"),
            ("queueId", "1"),
            ("queueOffset", "0"),
            ("maxMsgNums", "32"),
            ("sysFlag", "0"),
            ("subscription", "TagB || TagC"),
        ],
        b"",
    );
    assert_eq!(bodies(&r), ["m1"]);
    // Past the end: not found; far past: offset moved.
    assert_eq!(pull(&mut c, "Orders", 1, 4, 0).code, PULL_NOT_FOUND);
    assert_eq!(pull(&mut c, "Orders", 1, 100, 0).code, PULL_OFFSET_MOVED);
    // Lite pull uses the same header.
    let r = c.call(
        LITE_PULL_MESSAGE,
        &[
            ("topic", "Orders"),
            ("queueId", "1"),
            ("queueOffset", "3"),
            ("maxMsgNums", "8"),
        ],
        b"",
    );
    assert_eq!(bodies(&r), ["m3"]);

    // Queue offsets and times.
    let q = [("topic", "Orders"), ("queueId", "1")];
    assert_eq!(c.call(GET_MAX_OFFSET, &q, b"").field("offset"), Some("4"));
    assert_eq!(c.call(GET_MIN_OFFSET, &q, b"").field("offset"), Some("0"));
    let t: i64 = c
        .call(GET_EARLIEST_MSG_STORETIME, &q, b"")
        .field("timestamp")
        .unwrap()
        .parse()
        .unwrap();
    assert!(t > 0);
    let r = c.call(
        SEARCH_OFFSET_BY_TIMESTAMP,
        &[("topic", "Orders"), ("queueId", "1"), ("timestamp", "0")],
        b"",
    );
    assert_eq!(r.field("offset"), Some("0"));

    // Consumer offsets.
    let g = [
        ("consumerGroup", "cg"),
        ("topic", "Orders"),
        ("queueId", "1"),
    ];
    assert_eq!(
        c.call(QUERY_CONSUMER_OFFSET, &g, b"").field("offset"),
        Some("0")
    );
    let r = c.call(
        UPDATE_CONSUMER_OFFSET,
        &[g[0], g[1], g[2], ("commitOffset", "3")],
        b"",
    );
    assert_eq!(r.code, SUCCESS);
    assert_eq!(
        c.call(QUERY_CONSUMER_OFFSET, &g, b"").field("offset"),
        Some("3")
    );

    // Query by key (two messages share one) and view by id.
    let r = c.call(
        QUERY_MESSAGE,
        &[
            ("topic", "Orders"),
            ("key", "shared"),
            ("maxNum", "32"),
            ("beginTimestamp", "0"),
            ("endTimestamp", &i64::MAX.to_string()),
        ],
        b"",
    );
    assert_eq!(r.code, SUCCESS, "{:?}", r.remark);
    let mut found = bodies(&r);
    found.sort();
    assert_eq!(found, ["m0", "m3"]);
    let r = c.call(
        QUERY_MESSAGE,
        &[("topic", "Orders"), ("key", "nope"), ("maxNum", "32")],
        b"",
    );
    assert_eq!(r.code, QUERY_NOT_FOUND);
    let offset = i64::from_str_radix(&id0[16..], 16).unwrap().to_string();
    let r = c.call(VIEW_MESSAGE_BY_ID, &[("offset", &offset)], b"");
    assert_eq!(r.code, SUCCESS, "{:?}", r.remark);
    assert_eq!(bodies(&r), ["m0"]);
    let r = c.call(VIEW_MESSAGE_BY_ID, &[("offset", "12345")], b"");
    assert_eq!(r.code, SYSTEM_ERROR);
    let r = c.call(
        VIEW_MESSAGE_BY_ID,
        &[("offset", &i64::MAX.to_string())],
        b"",
    );
    assert_eq!(r.code, SYSTEM_ERROR);

    // A consumer sends m0 back with delay level 1 (1 s): it reappears in the group's
    // retry topic after the delay, not at once.
    let r = c.call(
        CONSUMER_SEND_MSG_BACK,
        &[
            ("offset", &offset),
            ("group", "cg"),
            ("delayLevel", "1"),
            ("originMsgId", &id0),
        ],
        b"",
    );
    assert_eq!(r.code, SUCCESS, "{:?}", r.remark);
    let sent_back = Instant::now();
    let r = pull(&mut c, "%RETRY%cg", 0, 0, 0);
    assert_ne!(r.code, SUCCESS, "the retry is visible only after its delay");
    let r = pull(&mut c, "%RETRY%cg", 0, 0, 5000);
    assert_eq!(r.code, SUCCESS, "{:?}", r.remark);
    assert!(sent_back.elapsed() >= Duration::from_millis(900));
    let back = records(&r.body);
    assert_eq!(back[0].body.as_ref(), b"m0");
    assert_eq!(back[0].reconsume_times, 1);
    assert_eq!(back[0].property("DELAY"), Some("1"));
    assert_eq!(back[0].property("RETRY_TOPIC"), Some("Orders"));
    assert_eq!(back[0].property("ORIGIN_MESSAGE_ID"), Some(id0.as_str()));
    let r = c.call(
        CONSUMER_SEND_MSG_BACK,
        &[("offset", "1"), ("group", "cg")],
        b"",
    );
    assert_eq!(r.code, SYSTEM_ERROR);

    // Heartbeat, consumer list, unregister.
    let hb = br#"{"clientID":"10.0.0.1@1","producerDataSet":[{"groupName":"pg"}],
        "consumerDataSet":[{"groupName":"cg","consumeType":"CONSUME_PASSIVELY",
        "messageModel":"CLUSTERING","subscriptionDataSet":[]}]}"#;
    assert_eq!(c.call(HEART_BEAT, &[], hb).code, SUCCESS);
    let r = c.call(GET_CONSUMER_LIST_BY_GROUP, &[("consumerGroup", "cg")], b"");
    let list: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(list["consumerIdList"][0], "10.0.0.1@1");
    let r = c.call(
        UNREGISTER_CLIENT,
        &[("clientID", "10.0.0.1@1"), ("consumerGroup", "cg")],
        b"",
    );
    assert_eq!(r.code, SUCCESS);
    let r = c.call(GET_CONSUMER_LIST_BY_GROUP, &[("consumerGroup", "cg")], b"");
    assert_eq!(r.code, SYSTEM_ERROR);
    assert_eq!(c.call(HEART_BEAT, &[], b"not json").code, SYSTEM_ERROR);

    // Topic creation sets the queue count seen by routes and sends.
    let r = c.call(
        UPDATE_AND_CREATE_TOPIC,
        &[
            ("topic", "Wide"),
            ("readQueueNums", "16"),
            ("writeQueueNums", "16"),
            ("perm", "6"),
        ],
        b"",
    );
    assert_eq!(r.code, SUCCESS);
    let r = ns.call(GET_ROUTEINFO_BY_TOPIC, &[("topic", "Wide")], b"");
    let route: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(route["queueDatas"][0]["readQueueNums"], 16);
    send(&mut c, "Wide", 15, "w", "t", "k");

    // Binary (ROCKETMQ) headers get binary responses.
    let r = c.request(
        GET_MAX_OFFSET,
        &[("topic", "Orders"), ("queueId", "1")],
        b"",
        SerializeType::RocketMq,
    );
    assert_eq!(r.field("offset"), Some("4"));

    // Unknown code: an error response, and the connection goes on.
    let r = c.call(9999, &[], b"");
    assert_eq!(r.code, REQUEST_CODE_NOT_SUPPORTED);
    assert!(r.remark.unwrap().contains("9999"));
    assert_eq!(c.call(GET_MAX_OFFSET, &q, b"").code, SUCCESS);

    // One-way requests get no response: the next response is for the next request.
    let mut oneway = RemotingCommand::request(
        UPDATE_CONSUMER_OFFSET,
        777,
        vec![
            ("consumerGroup".into(), "cg".into()),
            ("topic".into(), "Orders".into()),
            ("queueId".into(), "1".into()),
            ("commitOffset".into(), "4".into()),
        ],
    );
    oneway.flag = 2;
    c.send_raw(&oneway.encode());
    assert_eq!(
        c.call(QUERY_CONSUMER_OFFSET, &g, b"").field("offset"),
        Some("4")
    );

    // Metrics over HTTP.
    let mut m = TcpStream::connect(node.metrics_addr.unwrap()).unwrap();
    m.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut text = String::new();
    m.read_to_string(&mut text).unwrap();
    assert!(text.contains("coremq_puts_total{shard="), "{text}");
    // An unlabelled series' value.
    let value = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name}\n{text}"))
    };
    // The process's CPU (getrusage): the node in this test process has worked.
    let cpu = value("process_cpu_seconds_total");
    assert!(cpu > 0.0, "process_cpu_seconds_total {cpu}");
    // Put latency histogram: the +Inf bucket counts every put of that shard.
    let inf: u64 = text
        .lines()
        .filter(|l| l.starts_with("coremq_put_latency_seconds_bucket") && l.contains("le=\"+Inf\""))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    let puts: u64 = text
        .lines()
        .filter(|l| l.starts_with("coremq_puts_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert!(
        inf > 0 && inf <= puts,
        "latency count {inf}, puts {puts}\n{text}"
    );
    // One series per shard (the counters kept for requests on no shard's thread are
    // not a shard), and the requests counted over all of them.
    let series = |prefix: &str| text.lines().filter(|l| l.starts_with(prefix)).count();
    assert_eq!(
        series("coremq_puts_total{"),
        series("coremq_log_written_offset{"),
        "{text}"
    );
    let requests = value("coremq_requests_total");
    assert!(requests > 0.0, "requests {requests}\n{text}");
    // Log positions per shard, flushed never ahead of written.
    for name in [
        "coremq_log_written_offset",
        "coremq_log_committed_offset",
        "coremq_log_flushed_offset",
        "coremq_log_dispatched_offset",
    ] {
        assert!(
            text.contains(&format!("{name}{{shard=\"0\"}}")),
            "{name}\n{text}"
        );
    }
    assert!(
        text.contains("coremq_shard_failed{shard=\"0\"} 0"),
        "{text}"
    );

    // Restart: messages, topics and consumer offsets survive a clean shutdown.
    drop((c, ns));
    node.shutdown().unwrap();
    assert!(!dir.path().join("shard-0/abort").exists());
    let saved = std::fs::read_to_string(dir.path().join("config/consumerOffset.json")).unwrap();
    assert!(saved.contains("Orders@cg"), "{saved}");
    let node = start(dir.path(), network);
    let mut c = Client::connect(node.broker_addr);
    assert_eq!(
        c.call(QUERY_CONSUMER_OFFSET, &g, b"").field("offset"),
        Some("4")
    );
    assert_eq!(
        bodies(&pull(&mut c, "Orders", 1, 0, 1000)),
        ["m0", "m1", "m2", "m3"]
    );
    let r = ns_route_queues(&node, "Wide");
    assert_eq!(r, 16);
    node.shutdown().unwrap();
}

fn ns_route_queues(node: &Node, topic: &str) -> i64 {
    let mut ns = Client::connect(node.namesrv_addr.unwrap());
    let r = ns.call(GET_ROUTEINFO_BY_TOPIC, &[("topic", topic)], b"");
    let route: Value = serde_json::from_slice(&r.body).unwrap();
    route["queueDatas"][0]["readQueueNums"].as_i64().unwrap()
}

#[test]
fn long_poll_wakes_on_arrival_and_times_out_on_shards() {
    long_poll_wakes_on_arrival_and_times_out(Network::Shards);
}

#[test]
fn long_poll_wakes_on_arrival_and_times_out_on_threads() {
    long_poll_wakes_on_arrival_and_times_out(Network::Threads);
}

fn long_poll_wakes_on_arrival_and_times_out(network: Network) {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path(), network);
    let addr = node.broker_addr;
    // Nothing arrives: the pull is held for its timeout, then answered "not found".
    let mut c = Client::connect(addr);
    let t0 = Instant::now();
    let r = pull(&mut c, "Waits", 2, 0, 400);
    assert_eq!(r.code, PULL_NOT_FOUND);
    assert!(
        t0.elapsed() >= Duration::from_millis(350),
        "{:?}",
        t0.elapsed()
    );

    // A message sent while a pull is held wakes it long before its timeout.
    let sender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        let mut p = Client::connect(addr);
        send(&mut p, "Waits", 2, "late", "t", "k");
    });
    let t0 = Instant::now();
    let r = pull(&mut c, "Waits", 2, 0, 15_000);
    let waited = t0.elapsed();
    sender.join().unwrap();
    assert_eq!(r.code, SUCCESS, "{:?}", r.remark);
    assert_eq!(bodies(&r), ["late"]);
    assert!(waited < Duration::from_secs(5), "woke after {waited:?}");

    // A held pull does not block other requests on the same connection: send a
    // held pull, then a request, and read both responses (the second first).
    let mut held = RemotingCommand::request(
        PULL_MESSAGE,
        100,
        [
            ("topic", "Waits"),
            ("queueId", "3"),
            ("queueOffset", "0"),
            ("sysFlag", "2"),
            ("suspendTimeoutMillis", "1500"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
    );
    held.serialize_type = SerializeType::Json;
    c.send_raw(&held.encode());
    let quick = RemotingCommand::request(
        GET_MAX_OFFSET,
        101,
        vec![
            ("topic".into(), "Waits".into()),
            ("queueId".into(), "2".into()),
        ],
    );
    c.send_raw(&quick.encode());
    let first = c.read_response().unwrap();
    assert_eq!(first.opaque, 101);
    assert_eq!(first.field("offset"), Some("1"));
    let second = c.read_response().unwrap();
    assert_eq!(second.opaque, 100);
    assert_eq!(second.code, PULL_NOT_FOUND);

    // Shutdown answers a held pull rather than waiting for its timeout.
    let mut h = Client::connect(addr);
    let waiter = std::thread::spawn(move || pull(&mut h, "Waits", 1, 0, 60_000).code);
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    node.shutdown().unwrap();
    assert_eq!(waiter.join().unwrap(), PULL_NOT_FOUND);
    assert!(t0.elapsed() < Duration::from_secs(10));
}

/// A held pull wakes for whatever dispatch makes visible in its queue, not only for
/// the node's own sends: here a put through the node's embedded handle (RocketMQ's
/// `MessageArrivingListener`; before, such a message waited for the hold's 1 s
/// re-check).
#[test]
fn a_held_pull_wakes_for_a_put_through_the_nodes_handle() {
    for network in [Network::Shards, Network::Threads] {
        let dir = tempfile::tempdir().unwrap();
        let node = start(dir.path(), network);
        let h = node.handle();
        let putter = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            let m = coremq::Message::new("Embedded", 1, "from the handle");
            futures_lite::future::block_on(h.put(m)).status
        });
        let mut c = Client::connect(node.broker_addr);
        let t0 = Instant::now();
        let r = pull(&mut c, "Embedded", 1, 0, 10_000);
        let waited = t0.elapsed();
        assert!(putter.join().unwrap().is_stored());
        assert_eq!(r.code, SUCCESS, "{network:?}: {:?}", r.remark);
        assert_eq!(bodies(&r), ["from the handle"]);
        assert!(
            waited < Duration::from_millis(800),
            "{network:?}: the held pull woke after {waited:?}"
        );
        node.shutdown().unwrap();
    }
}

fn frame(word: u32, header: &[u8]) -> Vec<u8> {
    let mut w = ((4 + header.len()) as u32).to_be_bytes().to_vec();
    w.extend_from_slice(&word.to_be_bytes());
    w.extend_from_slice(header);
    w
}

#[test]
fn bad_input_closes_only_its_connection_on_shards() {
    bad_input_closes_only_its_connection(Network::Shards);
}

#[test]
fn bad_input_closes_only_its_connection_on_threads() {
    bad_input_closes_only_its_connection(Network::Threads);
}

fn bad_input_closes_only_its_connection(network: Network) {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path(), network);
    let addr = node.broker_addr;
    let mut good = Client::connect(addr);
    assert_eq!(
        good.call(GET_ROUTEINFO_BY_TOPIC, &[("topic", "T")], b"")
            .code,
        SUCCESS
    );

    let bad_inputs: Vec<(&str, Vec<u8>)> = vec![
        ("garbage", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()),
        ("huge length", 0x7FFF_0000u32.to_be_bytes().to_vec()),
        ("over the frame limit", (2u32 << 20).to_be_bytes().to_vec()),
        ("negative length", (-1i32).to_be_bytes().to_vec()),
        ("zero length", 0u32.to_be_bytes().to_vec()),
        ("header longer than frame", frame(1000, b"{}")),
        ("unknown serialize type", frame((9 << 24) | 2, b"{}")),
        ("json without code", frame(2, b"{}")),
        ("json not an object", frame(4, b"[1,2")),
        (
            "binary header cut short",
            frame((1 << 24) | 3, b"\x00\x01\x00"),
        ),
        (
            "binary ext length past the end",
            frame(
                (1 << 24) | 21,
                &[
                    0, 30, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0x7F, 0, 0, 0,
                ],
            ),
        ),
    ];
    for (name, bytes) in &bad_inputs {
        let mut c = Client::connect(addr);
        c.send_raw(bytes);
        assert!(c.is_closed(), "{name}: the connection should be closed");
    }
    // A truncated frame followed by a close, and one left hanging.
    let mut t = Client::connect(addr);
    t.send_raw(&100u32.to_be_bytes());
    t.send_raw(b"partial");
    drop(t);
    let mut hanging = Client::connect(addr);
    hanging.send_raw(&50u32.to_be_bytes());

    // A header without serializeTypeCurrentRPC, as some clients send, is served and
    // answered with the field.
    let mut c = Client::connect(addr);
    let header = br#"{"code":30,"language":"GO","version":0,"opaque":5,"flag":0,"extFields":{"topic":"T","queueId":"0"}}"#;
    c.send_raw(&frame(header.len() as u32, header));
    let mut len = [0u8; 4];
    c.s.read_exact(&mut len).unwrap();
    let mut payload = vec![0u8; u32::from_be_bytes(len) as usize];
    c.s.read_exact(&mut payload).unwrap();
    let text = String::from_utf8_lossy(&payload);
    assert!(
        text.contains(r#""serializeTypeCurrentRPC":"JSON""#),
        "{text}"
    );
    assert!(text.contains(r#""opaque":5"#), "{text}");

    // The first connection was never disturbed.
    assert_eq!(
        good.call(GET_ROUTEINFO_BY_TOPIC, &[("topic", "T")], b"")
            .code,
        SUCCESS
    );
    send(&mut good, "T", 0, "still fine", "t", "k");
    drop(hanging);
    node.shutdown().unwrap();
}

/// `coremq serve` as a process: config file, flags over it, SIGTERM shuts down
/// cleanly (no `abort`, offsets written).
#[test]
fn serve_binary_config_and_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    };
    let (broker, namesrv, metrics) = (free(), free(), free());
    let cfg = dir.path().join("coremq.toml");
    // The file names a port the flag overrides, and sets other keys. The HA port is a
    // free one: by default it is the broker port plus one, which another test's
    // listener may hold (with the default, this file failed 4 runs in 23 here, a
    // request to the node getting no answer; 0 in 12 since).
    std::fs::write(
        &cfg,
        format!(
            "listen = \"127.0.0.1:1\"\nshards = 1\npin = false\ndefault_queue_nums = 2\n\
             namesrv_listen = \"{namesrv}\"\noffset_flush_interval_ms = 100\n\
             ha_listen = \"127.0.0.1:0\"\n"
        ),
    )
    .unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_coremq"))
        .arg("serve")
        .arg("--config")
        .arg(&cfg)
        .arg("--data-dir")
        .arg(&data)
        .arg("--listen")
        .arg(broker.to_string())
        .arg("--metrics-listen")
        .arg(metrics.to_string())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut ns = loop {
        match TcpStream::connect(namesrv) {
            Ok(s) => {
                s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                break Client { s, opaque: 0 };
            }
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => panic!("node did not start: {e}"),
        }
    };
    let r = ns.call(GET_ROUTEINFO_BY_TOPIC, &[("topic", "Bin")], b"");
    let route: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(route["queueDatas"][0]["writeQueueNums"], 2);
    assert_eq!(
        route["brokerDatas"][0]["brokerAddrs"]["0"],
        broker.to_string()
    );
    let mut c = Client::connect(broker);
    send(&mut c, "Bin", 1, "hello", "t", "k");
    let r = c.call(
        UPDATE_CONSUMER_OFFSET,
        &[
            ("consumerGroup", "g"),
            ("topic", "Bin"),
            ("queueId", "1"),
            ("commitOffset", "1"),
        ],
        b"",
    );
    assert_eq!(r.code, SUCCESS);
    assert!(data.join("shard-0/abort").exists());
    // SAFETY: sending a signal to the child this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(!data.join("shard-0/abort").exists());
    let saved = std::fs::read_to_string(data.join("config/consumerOffset.json")).unwrap();
    assert!(saved.contains("Bin@g"), "{saved}");
}

/// Interop with Apache RocketMQ's C++ client (PyPI `rocketmq`), when asked for:
/// `COREMQ_INTEROP=1 cargo test --test node interop` (needs python3 and PyPI).
#[test]
fn interop_cpp_client_via_python() {
    if std::env::var_os("COREMQ_INTEROP").is_none() {
        println!("SKIPPED: set COREMQ_INTEROP=1 to run scripts/interop.sh");
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/interop.sh");
    let status = std::process::Command::new("bash")
        .arg(script)
        .env("COREMQ_BIN", env!("CARGO_BIN_EXE_coremq"))
        .status()
        .unwrap();
    match status.code() {
        Some(0) => {}
        Some(77) => println!("SKIPPED: the client could not be installed"),
        other => panic!("interop failed: {other:?}"),
    }
}

/// The documented example config parses and states the defaults.
#[test]
fn example_config_is_the_defaults() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("coremq.toml");
    let file = NodeConfig::from_file(&path).unwrap();
    let d = NodeConfig::default();
    assert_eq!(format!("{file:?}"), format!("{d:?}"));
    let bad = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(bad.path(), "listne = \"127.0.0.1:1\"\n").unwrap();
    let e = NodeConfig::from_file(bad.path()).unwrap_err().to_string();
    assert!(e.contains("listne"), "{e}");
}

/// With `namesrv_addr` set, the node registers with that name server (REGISTER_BROKER)
/// naming itself and its topics, with a body CRC the name server can check.
#[test]
fn registers_with_configured_name_servers() {
    let fake_ns = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let ns_addr = fake_ns.local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("config")).unwrap();
    std::fs::write(
        dir.path().join("config/topics.json"),
        r#"{"topicConfigTable":{"Known":{"readQueueNums":3,"writeQueueNums":3,"perm":6}}}"#,
    )
    .unwrap();
    let cfg = NodeConfig {
        data_dir: dir.path().to_path_buf(),
        listen: "127.0.0.1:0".parse().unwrap(),
        namesrv_enable: false,
        metrics_enable: false,
        shards: 1,
        pin: false,
        namesrv_addr: vec![ns_addr.to_string()],
        register_interval_ms: 200,
        ..NodeConfig::default()
    };
    let mut store = ShardedConfig::new(dir.path());
    store.shards = 1;
    store.pin = false;
    store.io_memory_bytes = 8 << 20;
    store.store = StoreConfig::small_for_tests(dir.path());
    let node = Node::start_with_store(cfg, store).unwrap();
    fake_ns.set_nonblocking(false).unwrap();
    for round in 0..2 {
        let (s, _) = fake_ns.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut c = Client { s, opaque: 0 };
        let mut len = [0u8; 4];
        c.s.read_exact(&mut len).unwrap();
        let mut payload = vec![0u8; u32::from_be_bytes(len) as usize];
        c.s.read_exact(&mut payload).unwrap();
        let req = decode_payload(payload.into()).unwrap();
        assert_eq!(req.code, REGISTER_BROKER);
        assert_eq!(
            req.field("brokerAddr"),
            Some(node.broker_addr.to_string().as_str())
        );
        assert_eq!(req.field("brokerId"), Some("0"));
        let crc = (crc32fast::hash(&req.body) & 0x7FFF_FFFF).to_string();
        assert_eq!(req.field("bodyCrc32"), Some(crc.as_str()));
        let body: Value = serde_json::from_slice(&req.body).unwrap();
        let t = &body["topicConfigSerializeWrapper"]["topicConfigTable"]["Known"];
        assert_eq!(t["writeQueueNums"], 3, "round {round}: {body}");
        let resp = RemotingCommand::response_to(&req, SUCCESS, None);
        c.send_raw(&resp.encode());
    }
    node.shutdown().unwrap();
}

/// Connections beyond `max_connections` are closed on accept; the others go on.
#[test]
fn connection_limit() {
    for network in [Network::Shards, Network::Threads] {
        let dir = tempfile::tempdir().unwrap();
        let node = start_with(dir.path(), network, |c| c.max_connections = 2);
        let mut a = Client::connect(node.broker_addr);
        let mut b = Client::connect(node.broker_addr);
        assert_eq!(
            a.call(GET_MAX_OFFSET, &[("topic", "T"), ("queueId", "0")], b"")
                .code,
            SUCCESS
        );
        assert_eq!(
            b.call(GET_MAX_OFFSET, &[("topic", "T"), ("queueId", "0")], b"")
                .code,
            SUCCESS
        );
        let mut c = Client::connect(node.broker_addr);
        assert!(
            c.is_closed(),
            "{network:?}: the third connection should be closed"
        );
        drop(b);
        // Once one closes, a new connection is served again.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut d = Client::connect(node.broker_addr);
            d.s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let probe = RemotingCommand::request(
                GET_MAX_OFFSET,
                9,
                vec![("topic".into(), "T".into()), ("queueId".into(), "0".into())],
            );
            if d.s.write_all(&probe.encode()).is_ok() && d.read_response().is_ok() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{network:?}: no connection served after one closed"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(
            a.call(GET_MAX_OFFSET, &[("topic", "T"), ("queueId", "0")], b"")
                .code,
            SUCCESS
        );
        node.shutdown().unwrap();
    }
}

/// Many connections at once over the shards' sockets, then a shutdown that finishes.
/// (Shards once shared one listening socket, and a shard could block in accept(2) on
/// its executor thread; that race is too narrow for this test to hit reliably, so
/// `listen.rs` gives each shard its own socket by construction.)
#[test]
fn many_connections_then_prompt_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path(), Network::Shards);
    let addr = node.broker_addr;
    let workers: Vec<_> = (0..16)
        .map(|w| {
            std::thread::spawn(move || {
                for i in 0..25 {
                    let mut c = Client::connect(addr);
                    let q = ((w + i) % 4).to_string();
                    let r = c.call(GET_MAX_OFFSET, &[("topic", "Many"), ("queueId", &q)], b"");
                    assert_eq!(r.code, SUCCESS);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(node.shutdown().is_ok()).unwrap());
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(20)),
        Ok(true),
        "shutdown hung"
    );
}

/// Interop with rocketmq-client-rust (crates.io), when asked for:
/// `COREMQ_INTEROP_RUST=1 cargo test --test node interop_rust` (a heavy build).
#[test]
fn interop_rust_client() {
    if std::env::var_os("COREMQ_INTEROP_RUST").is_none() {
        println!("SKIPPED: set COREMQ_INTEROP_RUST=1 to run scripts/interop_rust.sh");
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/interop_rust.sh");
    let status = std::process::Command::new("bash")
        .arg(script)
        .env("COREMQ_BIN", env!("CARGO_BIN_EXE_coremq"))
        .status()
        .unwrap();
    match status.code() {
        Some(0) => {}
        Some(77) => println!("SKIPPED: the client could not be built"),
        other => panic!("interop failed: {other:?}"),
    }
}

/// Beyond `max_held_pulls`, a pull that finds nothing is answered at once.
#[test]
fn held_pull_limit() {
    for network in [Network::Shards, Network::Threads] {
        let dir = tempfile::tempdir().unwrap();
        let node = start_with(dir.path(), network, |c| c.max_held_pulls = 1);
        let addr = node.broker_addr;
        let first = std::thread::spawn(move || {
            let mut c = Client::connect(addr);
            let t0 = Instant::now();
            let code = pull(&mut c, "Held", 0, 0, 1500).code;
            (code, t0.elapsed())
        });
        std::thread::sleep(Duration::from_millis(300));
        let mut c = Client::connect(addr);
        let t0 = Instant::now();
        assert_eq!(pull(&mut c, "Held", 1, 0, 5000).code, PULL_NOT_FOUND);
        assert!(
            t0.elapsed() < Duration::from_millis(1000),
            "{network:?}: {:?}",
            t0.elapsed()
        );
        let (code, waited) = first.join().unwrap();
        assert_eq!(code, PULL_NOT_FOUND);
        assert!(
            waited >= Duration::from_millis(1400),
            "{network:?}: {waited:?}"
        );
        // Once the first hold ended, pulls are held again.
        let t0 = Instant::now();
        assert_eq!(pull(&mut c, "Held", 1, 0, 400).code, PULL_NOT_FOUND);
        assert!(
            t0.elapsed() >= Duration::from_millis(350),
            "{network:?}: {:?}",
            t0.elapsed()
        );
        node.shutdown().unwrap();
    }
}

/// With `auto_create_topic = false`, unknown topics are refused until created.
#[test]
fn topics_must_exist_without_auto_create() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_with(dir.path(), Network::Shards, |c| c.auto_create_topic = false);
    let mut ns = Client::connect(node.namesrv_addr.unwrap());
    let mut c = Client::connect(node.broker_addr);
    let r = ns.call(GET_ROUTEINFO_BY_TOPIC, &[("topic", "Later")], b"");
    assert_eq!(r.code, TOPIC_NOT_EXIST);
    let r = c.call(SEND_MESSAGE, &[("topic", "Later"), ("queueId", "0")], b"x");
    assert_eq!(r.code, TOPIC_NOT_EXIST, "{:?}", r.remark);
    let r = c.call(
        UPDATE_AND_CREATE_TOPIC,
        &[
            ("topic", "Later"),
            ("readQueueNums", "2"),
            ("writeQueueNums", "2"),
        ],
        b"",
    );
    assert_eq!(r.code, SUCCESS);
    assert_eq!(
        ns.call(GET_ROUTEINFO_BY_TOPIC, &[("topic", "Later")], b"")
            .code,
        SUCCESS
    );
    send(&mut c, "Later", 1, "now", "t", "k");
    let r = c.call(
        UPDATE_AND_CREATE_TOPIC,
        &[("topic", "Bad Topic"), ("readQueueNums", "2")],
        b"",
    );
    assert_eq!(r.code, SYSTEM_ERROR);
    let r = c.call(
        UPDATE_AND_CREATE_TOPIC,
        &[("topic", "Zero"), ("readQueueNums", "0")],
        b"",
    );
    assert_eq!(r.code, SYSTEM_ERROR);
    node.shutdown().unwrap();
}

/// Writes `config/topics.json` (RocketMQ's `topicConfigTable` shape) before a node starts.
fn write_topics(dir: &Path, table: Value) {
    let config = dir.join("config");
    std::fs::create_dir_all(&config).unwrap();
    let text = serde_json::to_vec_pretty(&serde_json::json!({ "topicConfigTable": table }));
    std::fs::write(config.join("topics.json"), text.unwrap()).unwrap();
}

/// A queue id of `topic` owned by each shard (2 shards): `[on shard 0, on shard 1]`.
fn queue_per_shard(node: &Node, topic: &str) -> [i32; 2] {
    let h = node.handle();
    let on = |shard| (0..16).find(|q| h.shard_of(topic, *q) == shard).unwrap();
    [on(0), on(1)]
}

/// Connections enough that the kernel's `SO_REUSEPORT` spread puts some on every shard
/// (2 shards: all 8 on one shard has odds 1 in 128).
fn clients(node: &Node) -> Vec<Client> {
    (0..8).map(|_| Client::connect(node.broker_addr)).collect()
}

/// Every connection still sends to a queue on each shard, and each queue's messages
/// are pulled back whole: no shard was lost.
fn every_shard_serves(node: &Node, clients: &mut [Client], topic: &str) {
    let sixteen = [
        ("topic", topic),
        ("readQueueNums", "16"),
        ("writeQueueNums", "16"),
    ];
    assert_eq!(
        clients[0].call(UPDATE_AND_CREATE_TOPIC, &sixteen, b"").code,
        SUCCESS
    );
    let queues = queue_per_shard(node, topic);
    for (i, c) in clients.iter_mut().enumerate() {
        for q in queues {
            send(c, topic, q, &format!("after-{i}"), "t", "k");
        }
    }
    futures_lite::future::block_on(node.handle().wait_dispatched()).unwrap();
    let c = &mut clients[0];
    for q in queues {
        let r = pull(c, topic, q, 0, 0);
        assert_eq!(r.code, SUCCESS, "{:?}", r.remark);
        assert_eq!(bodies(&r).len(), 8, "queue {q}");
    }
}

#[test]
fn drained_topic_from_topics_json_on_shards() {
    drained_topic_from_topics_json(Network::Shards);
}

#[test]
fn drained_topic_from_topics_json_on_threads() {
    drained_topic_from_topics_json(Network::Threads);
}

/// `config/topics.json` as a RocketMQ broker leaves it: a topic being drained
/// (`writeQueueNums` 0, which RocketMQ allows) and an entry that names no queue counts
/// or permission (RocketMQ's `TopicConfig` defaults: 16 read and 16 write queues,
/// perm 6). A send with `queueId` -1 to the drained topic divided by zero and took
/// the connection's shard down with its store (issue 16); now it gets a clear
/// refusal and every shard goes on serving.
fn drained_topic_from_topics_json(network: Network) {
    let dir = tempfile::tempdir().unwrap();
    write_topics(
        dir.path(),
        serde_json::json!({
            "Drained": {"topicName": "Drained", "readQueueNums": 4, "writeQueueNums": 0, "perm": 6},
            "Unsized": {"topicName": "Unsized"},
        }),
    );
    let node = start(dir.path(), network);
    let mut clients = clients(&node);
    for c in clients.iter_mut() {
        for q in ["-1", "-7", "0"] {
            let r = c.call(SEND_MESSAGE, &[("topic", "Drained"), ("queueId", q)], b"x");
            assert_eq!(r.code, SYSTEM_ERROR, "queueId {q}: {:?}", r.remark);
            let remark = r.remark.unwrap();
            assert!(
                remark.contains("Drained") && remark.contains("0 write queues"),
                "{remark}"
            );
        }
        let r = c.call(
            SEND_MESSAGE_V2,
            &[("b", "Unsized"), ("e", "-1"), ("a", "pg")],
            b"y",
        );
        assert_eq!(r.code, SUCCESS, "{:?}", r.remark);
        let q: i32 = r.field("queueId").unwrap().parse().unwrap();
        assert!((0..16).contains(&q), "{q}");
    }
    let mut ns = Client::connect(node.namesrv_addr.unwrap());
    let route = |ns: &mut Client, topic: &str| -> Value {
        let r = ns.call(GET_ROUTEINFO_BY_TOPIC, &[("topic", topic)], b"");
        assert_eq!(r.code, SUCCESS, "{:?}", r.remark);
        serde_json::from_slice::<Value>(&r.body).unwrap()["queueDatas"][0].clone()
    };
    let drained = route(&mut ns, "Drained");
    assert_eq!(
        (
            drained["writeQueueNums"].clone(),
            drained["readQueueNums"].clone()
        ),
        (0.into(), 4.into())
    );
    let unsized_ = route(&mut ns, "Unsized");
    assert_eq!(
        (
            unsized_["writeQueueNums"].clone(),
            unsized_["readQueueNums"].clone(),
            unsized_["perm"].clone()
        ),
        (16.into(), 16.into(), 6.into())
    );
    // The drained topic's queues still serve pulls.
    assert_eq!(
        pull(&mut clients[0], "Drained", 3, 0, 0).code,
        PULL_NOT_FOUND
    );
    every_shard_serves(&node, &mut clients, "Live");
    drop(clients);
    node.shutdown().unwrap();
}

/// The node's Prometheus text (`GET /metrics`).
fn metrics_text(node: &Node) -> String {
    let mut m = TcpStream::connect(node.metrics_addr.unwrap()).unwrap();
    m.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    m.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut text = String::new();
    m.read_to_string(&mut text).expect("metrics answer");
    text
}

/// One unlabelled sample of the node's metrics.
fn metric(node: &Node, name: &str) -> u64 {
    let text = metrics_text(node);
    let prefix = format!("{name} ");
    let line = text.lines().find(|l| l.starts_with(&prefix));
    let line = line.unwrap_or_else(|| panic!("no {name} in\n{text}"));
    line[prefix.len()..].parse().unwrap()
}

#[test]
fn handler_panic_costs_only_its_request_on_shards() {
    handler_panic_costs_only_its_request(Network::Shards);
}

#[test]
fn handler_panic_costs_only_its_request_on_threads() {
    handler_panic_costs_only_its_request(Network::Threads);
}

/// A request whose handler panics (the `test_hooks` code) is answered `SYSTEM_ERROR`
/// naming its code, counted in the metrics, and its shard and connection go on:
/// glommio does not catch a task's panic, so before the catch it took the shard's
/// executor and store down (issue 16). A node without `test_hooks` does not know the
/// code.
fn handler_panic_costs_only_its_request(network: Network) {
    let dir = tempfile::tempdir().unwrap();
    let node = start_with(dir.path(), network, |c| c.test_hooks = true);
    let mut clients = clients(&node);
    for c in clients.iter_mut() {
        let r = c.call(TEST_PANIC_IN_HANDLER, &[], b"");
        assert_eq!(r.code, SYSTEM_ERROR);
        let remark = r.remark.unwrap();
        assert!(
            remark.contains("request code -16001") && remark.contains("panicked"),
            "{remark}"
        );
    }
    // A one-way request that panics gets no answer; the next request gets its own.
    let mut oneway = RemotingCommand::request(TEST_PANIC_IN_HANDLER, 9_999, Vec::new());
    oneway.flag = 2;
    clients[0].send_raw(&oneway.encode());
    every_shard_serves(&node, &mut clients, "AfterPanic");
    assert_eq!(metric(&node, "coremq_request_panics_total"), 9);
    assert_eq!(metric(&node, "coremq_node_failed"), 0);
    assert_eq!(node.failure(), None);
    drop(clients);
    node.shutdown().unwrap();

    let node = start(dir.path(), network);
    let mut c = Client::connect(node.broker_addr);
    for code in [TEST_PANIC_IN_HANDLER, TEST_PANIC_IN_STORE] {
        assert_eq!(c.call(code, &[], b"").code, REQUEST_CODE_NOT_SUPPORTED);
    }
    node.shutdown().unwrap();
}

#[test]
fn store_panic_fails_the_node_loudly_on_shards() {
    store_panic_fails_the_node_loudly(Network::Shards);
}

#[test]
fn store_panic_fails_the_node_loudly_on_threads() {
    store_panic_fails_the_node_loudly(Network::Threads);
}

/// A panic inside the store is not caught (the store may be half-updated): its shard
/// stops taking anything, and the node says so instead of going on with a silently dead
/// shard: `Node::failure`, `coremq_node_failed` 1, and a shutdown that reports the dead
/// shard without waiting for it.
fn store_panic_fails_the_node_loudly(network: Network) {
    let dir = tempfile::tempdir().unwrap();
    let node = start_with(dir.path(), network, |c| c.test_hooks = true);
    let mut c = Client::connect(node.broker_addr);
    send(&mut c, "Before", 0, "kept", "t", "k");
    // On a shard front end the panic takes the connection's own shard down, on
    // threads shard 0: either way no answer comes.
    let req = RemotingCommand::request(TEST_PANIC_IN_STORE, 1, Vec::new());
    c.send_raw(&req.encode());
    let deadline = Instant::now() + Duration::from_secs(10);
    let why = loop {
        if let Some(why) = node.failure() {
            break why;
        }
        assert!(Instant::now() < deadline, "no failure reported");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        why.contains("shard") || why.contains("store panicked"),
        "{why}"
    );
    assert_eq!(metric(&node, "coremq_node_failed"), 1);
    let text = metrics_text(&node);
    let dead = (0..2)
        .filter(|i| text.contains(&format!("coremq_shard_failed{{shard=\"{i}\"}} 1")))
        .count();
    assert_eq!(dead, 1, "{text}");
    let t0 = Instant::now();
    let stopped = node.shutdown();
    assert!(stopped.is_err(), "the dead shard is reported");
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
}

/// `coremq serve` with a shard killed by a panic inside the store: the process does
/// not go on with a dead shard. It says why on stderr, shuts the live shard down
/// cleanly (its `abort` removed) and exits with status 3; a restart recovers the dead
/// shard, and every acknowledged (sync) message is there.
#[test]
fn serve_exits_with_status_3_when_a_shard_dies() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let broker = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let cfg = dir.path().join("coremq.toml");
    std::fs::write(
        &cfg,
        format!(
            "listen = \"{broker}\"\nshards = 2\npin = false\nflush = \"sync\"\n\
             namesrv_enable = false\nmetrics_enable = false\ntest_hooks = true\n\
             ha_listen = \"127.0.0.1:0\"\n"
        ),
    )
    .unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_coremq"))
        .arg("serve")
        .arg("--config")
        .arg(&cfg)
        .arg("--data-dir")
        .arg(&data)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut c = loop {
        match TcpStream::connect(broker) {
            Ok(s) => {
                s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                break Client { s, opaque: 0 };
            }
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => panic!("node did not start: {e}"),
        }
    };
    let sixteen = [
        ("topic", "Kept"),
        ("readQueueNums", "16"),
        ("writeQueueNums", "16"),
    ];
    assert_eq!(c.call(UPDATE_AND_CREATE_TOPIC, &sixteen, b"").code, SUCCESS);
    for q in 0..16 {
        send(&mut c, "Kept", q, &format!("kept-{q}"), "t", "k");
    }
    let req = RemotingCommand::request(TEST_PANIC_IN_STORE, 1, Vec::new());
    c.send_raw(&req.encode());
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("coremq serve went on with a dead shard");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert_eq!(status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("the node failed"), "{stderr}");
    let aborts: Vec<bool> = (0..2)
        .map(|i| data.join(format!("shard-{i}/abort")).exists())
        .collect();
    assert_eq!(
        aborts.iter().filter(|a| **a).count(),
        1,
        "only the dead shard misses its clean shutdown: {aborts:?}"
    );
    // A restart recovers the dead shard; every acknowledged message is there.
    let node = Node::start(NodeConfig {
        data_dir: data.clone(),
        listen: "127.0.0.1:0".parse().unwrap(),
        namesrv_enable: false,
        metrics_enable: false,
        shards: 2,
        pin: false,
        flush: "sync".into(),
        ..NodeConfig::default()
    })
    .unwrap();
    futures_lite::future::block_on(node.handle().wait_dispatched()).unwrap();
    let mut c = Client::connect(node.broker_addr);
    for q in 0..16 {
        let r = pull(&mut c, "Kept", q, 0, 0);
        assert_eq!(bodies(&r), [format!("kept-{q}")], "queue {q}");
    }
    node.shutdown().unwrap();
}

#[test]
fn processor_input_regressions_on_shards() {
    processor_input_regressions(Network::Shards);
}

#[test]
fn processor_input_regressions_on_threads() {
    processor_input_regressions(Network::Threads);
}

/// Inputs the processor audit and `tests/processors.rs` found mishandled (issue 16).
fn processor_input_regressions(network: Network) {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path(), network);
    let mut c = Client::connect(node.broker_addr);

    // A one-way pull was answered: the client got a response it never asked for
    // (here, before the next request's own).
    let mut oneway = RemotingCommand::request(
        PULL_MESSAGE,
        7_777,
        vec![
            ("topic".into(), "T".into()),
            ("queueId".into(), "0".into()),
            ("queueOffset".into(), "0".into()),
        ],
    );
    oneway.flag = 2;
    c.send_raw(&oneway.encode());
    assert_eq!(
        c.call(GET_MAX_OFFSET, &[("topic", "T"), ("queueId", "0")], b"")
            .code,
        SUCCESS
    );

    // A message whose reconsume count is i32::MAX, sent back: `count + 1` overflowed
    // (a panic in debug builds). It goes to the dead-letter topic, count saturated.
    let r = c.call(
        SEND_MESSAGE,
        &[
            ("topic", "T"),
            ("queueId", "0"),
            ("reconsumeTimes", "2147483647"),
        ],
        b"old",
    );
    assert_eq!(r.code, SUCCESS, "{:?}", r.remark);
    let id = r.field("msgId").unwrap();
    let offset = i64::from_str_radix(&id[16..], 16).unwrap().to_string();
    futures_lite::future::block_on(node.handle().wait_dispatched()).unwrap();
    let r = c.call(
        CONSUMER_SEND_MSG_BACK,
        &[("offset", &offset), ("group", "cg")],
        b"",
    );
    assert_eq!(r.code, SUCCESS, "{:?}", r.remark);
    let r = pull(&mut c, "%DLQ%cg", 0, 0, 2000);
    assert_eq!(r.code, SUCCESS, "{:?}", r.remark);
    assert_eq!(records(&r.body)[0].reconsume_times, i32::MAX);

    // Remarks echoed whole request values: 100,000 0x01 bytes as a topic made a
    // 600 kB remark (a 15 MiB one, a header too long to frame). Echoes are cut.
    let huge = "\u{1}".repeat(100_000);
    for (code, fields) in [
        (
            SEND_MESSAGE,
            vec![("topic", huge.as_str()), ("queueId", "0")],
        ),
        (UPDATE_AND_CREATE_TOPIC, vec![("topic", huge.as_str())]),
        (GET_ROUTEINFO_BY_TOPIC, vec![("topic", huge.as_str())]),
        (
            GET_CONSUMER_LIST_BY_GROUP,
            vec![("consumerGroup", huge.as_str())],
        ),
        (
            GET_MAX_OFFSET,
            vec![("topic", "T"), ("queueId", huge.as_str())],
        ),
    ] {
        let r = c.call(code, &fields, b"");
        assert_ne!(r.code, SUCCESS);
        let remark = r.remark.unwrap();
        assert!(remark.len() < 1024, "code {code}: {} bytes", remark.len());
        assert!(remark.contains("100000 bytes"), "code {code}: {remark}");
    }
    drop(c);
    node.shutdown().unwrap();
}

/// Deadlines are `now + setting`: a setting so large that the sum overflows `Instant`
/// panicked the request (a held pull with `max_suspend_ms` near `u64::MAX`) or the
/// registration thread. Settings are capped at a week.
#[test]
fn interval_settings_are_bounded() {
    for set in [
        |c: &mut NodeConfig| c.max_suspend_ms = u64::MAX,
        |c: &mut NodeConfig| c.register_interval_ms = u64::MAX / 2,
        |c: &mut NodeConfig| c.idle_timeout_ms = 8 * 24 * 3600 * 1000,
    ] {
        let mut cfg = NodeConfig::default();
        set(&mut cfg);
        let e = cfg.validate().unwrap_err().to_string();
        assert!(e.contains("_ms must be at most"), "{e}");
    }
    let week = NodeConfig {
        max_suspend_ms: 7 * 24 * 3600 * 1000,
        ..NodeConfig::default()
    };
    week.validate().unwrap();
}

/// The shards' wake-up settings reach the store the node opens (absent: the store's
/// defaults), and a spin longer than a second is refused before anything is bound.
#[test]
fn wake_up_settings_reach_the_store_and_are_bounded() {
    let d = NodeConfig::default().sharded_config();
    let dflt = ShardedConfig::new("x");
    assert_eq!(d.awake_window, dflt.awake_window);
    assert_eq!(d.reply_spin, dflt.reply_spin);
    assert_eq!(d.timer_spin, dflt.timer_spin);
    let file = tempfile::NamedTempFile::new().unwrap();
    let text = "awake_window_us = 0\nreply_spin_us = 20\ntimer_spin_us = 0\n";
    std::fs::write(file.path(), text).unwrap();
    let cfg = NodeConfig::from_file(file.path()).unwrap();
    cfg.validate().unwrap();
    let s = cfg.sharded_config();
    assert_eq!(s.awake_window, Duration::ZERO);
    assert_eq!(s.reply_spin, Duration::from_micros(20));
    assert_eq!(s.timer_spin, Duration::ZERO);
    for bad in [
        "awake_window_us = 1000001\n",
        "reply_spin_us = 5000000\n",
        "timer_spin_us = 1000001\n",
    ] {
        std::fs::write(file.path(), bad).unwrap();
        let e = NodeConfig::from_file(file.path()).unwrap().validate();
        let e = e.unwrap_err().to_string();
        assert!(e.contains("must be at most 1000000"), "{e}");
    }
}

/// The key index's settings in the TOML reach the store the node opens:
/// `message_index_enable` (RocketMQ `messageIndexEnable`), the files' geometry
/// (`max_hash_slot_num`, `max_index_num`: RocketMQ `maxHashSlotNum`, `maxIndexNum`), its
/// page memory and its flush pacing. A node started from such a file makes index files of
/// that size and finds a key through them; reopened with another geometry it is refused
/// (its files would be misread), and a bad value is refused by `validate` by its name.
#[test]
fn index_settings_reach_the_store() {
    assert!(NodeConfig::default().sharded_config().store.index_enable);
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), "message_index_enable = false\n").unwrap();
    let cfg = NodeConfig::from_file(file.path()).unwrap();
    cfg.validate().unwrap();
    assert!(!cfg.sharded_config().store.index_enable);

    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        "data_dir = {:?}\nlisten = \"127.0.0.1:0\"\nnamesrv_enable = false\n\
         metrics_enable = false\nshards = 1\npin = false\nmax_hash_slot_num = 64\n\
         max_index_num = 256\nindex_max_dirty_bytes = 65536\nindex_cache_bytes = 0\n\
         index_flush_least_pages = 1\nindex_flush_thorough_interval_ms = 100\n",
        dir.path()
    );
    std::fs::write(file.path(), toml).unwrap();
    let cfg = NodeConfig::from_file(file.path()).unwrap();
    let s = cfg.sharded_config().store;
    assert_eq!(
        (s.index_hash_slots, s.index_max_entries),
        (64, 256),
        "geometry"
    );
    assert_eq!(
        (
            s.index_max_dirty_bytes,
            s.index_cache_bytes,
            s.index_flush_least_pages
        ),
        (65536, 0, 1)
    );
    assert_eq!(s.index_flush_thorough_interval, Duration::from_millis(100));

    let node = Node::start(cfg.clone()).unwrap();
    let mut c = Client::connect(node.broker_addr);
    send(&mut c, "Keyed", 0, "kept", "", "wanted");
    futures_lite::future::block_on(node.handle().wait_dispatched()).unwrap();
    let r = c.call(
        QUERY_MESSAGE,
        &[("topic", "Keyed"), ("key", "wanted"), ("maxNum", "32")],
        b"",
    );
    assert_eq!(r.code, SUCCESS, "{:?}", r.remark);
    assert_eq!(bodies(&r), ["kept"]);
    drop(c);
    node.shutdown().unwrap();
    // RocketMQ's IndexFile: a 40-byte header, 4 bytes a slot, 20 an entry.
    let sizes: Vec<u64> = std::fs::read_dir(dir.path().join("shard-0/index"))
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().len() == 17)
        .map(|e| e.metadata().unwrap().len())
        .collect();
    assert!(!sizes.is_empty(), "no index file");
    assert!(
        sizes.iter().all(|&n| n == 40 + 64 * 4 + 256 * 20),
        "{sizes:?}"
    );

    let other = NodeConfig {
        max_hash_slot_num: 128,
        ..cfg.clone()
    };
    let e = Node::start(other).err().expect("refused").to_string();
    assert!(e.contains("max_hash_slot_num"), "{e}");
    let bad = NodeConfig {
        max_index_num: 1,
        ..cfg
    };
    let e = bad.validate().unwrap_err().to_string();
    assert!(e.contains("max_index_num"), "{e}");
}

/// The load generator's lean remote client (`coremq bench --target`): single sends in
/// both header formats (8 in flight, and one at a time on one thread) and batched
/// sends are all acknowledged and read back through pull, and its loopback echo floor
/// (`--target echo`) counts every round trip.
#[test]
fn load_generator_drives_the_node() {
    use coremq::tools::loadgen::{BodySize, HeaderFormat, LoadConfig, RemoteRequest, remote};
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path(), Network::Shards);
    let target = node.broker_addr.to_string();
    let mut stored = 0u64;
    for (batch, format, body, outstanding) in [
        (1, HeaderFormat::Json, BodySize::fixed(1024), 8),
        (1, HeaderFormat::Rocketmq, BodySize { min: 8, max: 3000 }, 1),
        (16, HeaderFormat::Json, BodySize { min: 100, max: 700 }, 8),
    ] {
        let cfg = LoadConfig {
            messages: Some(1000),
            queues: 3,
            topics: 2,
            producers: 2,
            outstanding,
            batch,
            body,
            header_format: format,
            consumers: true,
            quiet: true,
            ..LoadConfig::default()
        };
        let (report, good) = remote::run(&cfg, &target).unwrap();
        stored += 1000;
        assert!(good, "{report}");
        assert_eq!(report["messages_acknowledged"], 1000, "{report}");
        assert_eq!(report["messages_failed"], 0, "{report}");
        // Read back counts every message in the bench topics, earlier rounds too.
        assert_eq!(report["read_back"], stored, "{report}");
    }
    // Heartbeats instead of sends: every one answered `SUCCESS` (a refused one counts
    // as failed), and nothing is stored by them.
    let cfg = LoadConfig {
        messages: Some(300),
        producers: 2,
        outstanding: 4,
        request: RemoteRequest::Heartbeat,
        quiet: true,
        ..LoadConfig::default()
    };
    let (report, good) = remote::run(&cfg, &target).unwrap();
    assert!(good, "{report}");
    assert_eq!(report["messages_acknowledged"], 300, "{report}");
    assert_eq!(report["messages_failed"], 0, "{report}");
    assert_eq!(report["request"], "heartbeat", "{report}");
    let after = LoadConfig {
        messages: Some(1),
        topics: 2,
        queues: 3,
        consumers: true,
        quiet: true,
        ..LoadConfig::default()
    };
    let (report, _) = remote::run(&after, &target).unwrap();
    assert_eq!(report["read_back"], stored + 1, "{report}");
    assert!(remote::run(&cfg, "echo").is_err(), "heartbeats need a node");
    for refused in [
        LoadConfig {
            batch: 4,
            ..cfg.clone()
        },
        LoadConfig {
            consumers: true,
            ..cfg.clone()
        },
    ] {
        assert!(
            remote::run(&refused, &target).is_err(),
            "heartbeats carry no messages"
        );
    }
    node.shutdown().unwrap();
    let cfg = LoadConfig {
        messages: Some(500),
        outstanding: 4,
        quiet: true,
        ..LoadConfig::default()
    };
    let (report, good) = remote::run(&cfg, "echo").unwrap();
    assert!(good, "{report}");
    assert_eq!(report["messages_acknowledged"], 500, "{report}");
}

/// A node that goes away in the middle of a pipelined run: the load generator's
/// producers (one thread over their connections, `remote/pipelined.rs`) end promptly
/// instead of waiting out the run and the 30 s drain for answers that cannot come,
/// and count the sends they had in flight as failed, not acknowledged.
#[test]
fn a_pipelined_run_ends_when_its_node_goes_away() {
    use coremq::tools::loadgen::{LoadConfig, remote};
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path(), Network::Shards);
    let target = node.broker_addr.to_string();
    let cfg = LoadConfig {
        duration: 20.0,
        producers: 2,
        outstanding: 16,
        queues: 4,
        quiet: true,
        ..LoadConfig::default()
    };
    let run = std::thread::spawn(move || remote::run(&cfg, &target));
    std::thread::sleep(Duration::from_millis(1500));
    let stopped = Instant::now();
    node.shutdown().unwrap();
    let (report, good) = run.join().unwrap().unwrap();
    assert!(
        stopped.elapsed() < Duration::from_secs(10),
        "the run went on {:?} after its node stopped: {report}",
        stopped.elapsed()
    );
    assert!(!good, "{report}");
    assert!(
        report["messages_acknowledged"].as_u64().unwrap() > 0,
        "{report}"
    );
    assert!(report["messages_failed"].as_u64().unwrap() > 0, "{report}");
}

/// The remote load generator's pipelined producers' connections dealt over fewer
/// threads (`--client-threads`): every producer still opens its own connection and
/// sends its share, five producers over two threads (two and three) as over five.
#[test]
fn pipelined_producers_share_their_client_threads() {
    use coremq::tools::loadgen::{LoadConfig, remote};
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path(), Network::Shards);
    let target = node.broker_addr.to_string();
    let mut opened_by = Vec::new();
    for threads in [2, 5] {
        let accepted = metric(&node, "coremq_connections_accepted_total");
        let cfg = LoadConfig {
            messages: Some(3000),
            producers: 5,
            client_threads: Some(threads),
            outstanding: 8,
            queues: 4,
            quiet: true,
            ..LoadConfig::default()
        };
        let (report, good) = remote::run(&cfg, &target).unwrap();
        assert!(good, "{report}");
        assert_eq!(report["messages_acknowledged"], 3000, "{report}");
        assert_eq!(report["messages_failed"], 0, "{report}");
        assert_eq!(report["client_threads"], threads, "{report}");
        let opened = metric(&node, "coremq_connections_accepted_total") - accepted;
        assert!(opened > 5, "{opened} connections for 5 producers: {report}");
        opened_by.push(opened);
    }
    // The same connections whatever the threads (an admin connection and one per
    // producer here, a node without shard ports).
    assert_eq!(opened_by[0], opened_by[1], "{opened_by:?}");
    node.shutdown().unwrap();
}

/// The remote load generator's paced sends (`--rate`) go out when each is due: a
/// burst of pipelined requests is written as soon as the next one is not yet due.
/// It used to sleep for every later request of a burst before writing it, so each
/// waited in the client for the ones after it: at 200 msg/s with 8 outstanding, a
/// send round trip of ~16 ms at p50 against the echo server's ~0.1 ms. The bound
/// here (5 ms) is a third of what that gave.
#[test]
fn paced_remote_sends_are_not_held_for_later_ones() {
    use coremq::tools::loadgen::{LoadConfig, remote};
    let cfg = LoadConfig {
        messages: Some(60),
        producers: 1,
        outstanding: 8,
        rate: Some(200.0),
        quiet: true,
        ..LoadConfig::default()
    };
    let (report, good) = remote::run(&cfg, "echo").unwrap();
    assert!(good, "{report}");
    assert_eq!(report["messages_acknowledged"], 60, "{report}");
    let p50 = report["send_latency_us"]["p50"].as_f64().unwrap();
    assert!(p50 < 5_000.0, "paced send p50 {p50} us: {report}");
}
