//! RocketMQ requests built from arbitrary bytes, to drive the node's request
//! processors: shared by `tests/processors.rs` (a proptest in every `cargo test`) and
//! `scripts/fuzz/fuzz_targets/processors.rs` (cargo-fuzz, coverage-guided), which
//! includes this file by path.
//!
//! The bytes choose, in turn: the request code (every code the node serves, plus
//! unknown ones), one-way or not, then for each header field that code's processor
//! reads whether it is absent, an extreme or well-known value of its kind, a value seen
//! in an earlier response (offsets and message ids, so look-ups hit real records), or
//! arbitrary text; then a body (arbitrary, or a batch or heartbeat that is well-formed
//! in shape with arbitrary parts). Bytes that run out read as zeros, so every input
//! builds requests and a short input builds plain ones.

#![allow(dead_code)]

use bytes::Bytes;
use coremq::node::remoting::codes::*;
use coremq::node::remoting::{RemotingCommand, SerializeType};
use coremq::node::{Network, Node, NodeConfig};
use coremq::{ShardedConfig, StoreConfig};
use std::path::Path;

/// A two-shard node on `dir` (small store, metrics on an ephemeral port, holds of at
/// most 20 ms) whose `topics.json` already holds a drained topic (`Drained`: 0 write
/// queues), one with no counts (`Unsized`: RocketMQ's defaults) and `Orders`.
pub fn start_node(dir: &Path, network: Network) -> Node {
    let config = dir.join("config");
    std::fs::create_dir_all(&config).unwrap();
    let topics = serde_json::json!({ "topicConfigTable": {
        "Drained": {"topicName": "Drained", "readQueueNums": 4, "writeQueueNums": 0, "perm": 6},
        "Unsized": {"topicName": "Unsized"},
        "Orders": {"topicName": "Orders", "readQueueNums": 8, "writeQueueNums": 8, "perm": 6},
    }});
    std::fs::write(config.join("topics.json"), topics.to_string()).unwrap();
    let cfg = NodeConfig {
        network,
        data_dir: dir.to_path_buf(),
        listen: "127.0.0.1:0".parse().unwrap(),
        namesrv_enable: false,
        metrics_listen: "127.0.0.1:0".parse().unwrap(),
        shards: 2,
        pin: false,
        max_suspend_ms: 20,
        offset_flush_interval_ms: 200,
        ..NodeConfig::default()
    };
    let mut store = ShardedConfig::new(dir);
    store.shards = 2;
    store.pin = false;
    store.io_memory_bytes = 8 << 20;
    store.store = StoreConfig::small_for_tests(dir);
    Node::start_with_store(cfg, store).expect("node starts")
}

/// Reads choices from the input bytes.
pub struct Gen<'a> {
    data: &'a [u8],
}

impl<'a> Gen<'a> {
    pub fn new(data: &'a [u8]) -> Gen<'a> {
        Gen { data }
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((b, rest)) => {
                self.data = rest;
                *b
            }
            None => 0,
        }
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.byte(), self.byte()])
    }

    /// A number in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n <= 256 {
            self.byte() as usize % n
        } else {
            self.u16() as usize % n
        }
    }

    pub fn pick<T: Clone>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())].clone()
    }

    /// Up to `max` raw bytes.
    pub fn bytes(&mut self, max: usize) -> &'a [u8] {
        let n = self.below(max + 1).min(self.data.len());
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        head
    }

    /// Up to `max` bytes as text (lossy UTF-8; RocketMQ's separators stay).
    pub fn text(&mut self, max: usize) -> String {
        String::from_utf8_lossy(self.bytes(max)).into_owned()
    }
}

/// Codes sent: every code the node serves, and some it does not.
pub const CODES: &[i32] = &[
    SEND_MESSAGE,
    SEND_MESSAGE_V2,
    SEND_BATCH_MESSAGE,
    CONSUMER_SEND_MSG_BACK,
    PULL_MESSAGE,
    LITE_PULL_MESSAGE,
    QUERY_MESSAGE,
    VIEW_MESSAGE_BY_ID,
    UPDATE_AND_CREATE_TOPIC,
    GET_MAX_OFFSET,
    GET_MIN_OFFSET,
    SEARCH_OFFSET_BY_TIMESTAMP,
    GET_EARLIEST_MSG_STORETIME,
    HEART_BEAT,
    UNREGISTER_CLIENT,
    QUERY_CONSUMER_OFFSET,
    UPDATE_CONSUMER_OFFSET,
    GET_CONSUMER_LIST_BY_GROUP,
    GET_ROUTEINFO_BY_TOPIC,
    GET_BROKER_CLUSTER_INFO,
    REGISTER_BROKER,
    GET_BROKER_RUNTIME_INFO,
    GET_BROKER_CONFIG,
    UPDATE_BROKER_CONFIG,
    GET_TOPIC_STATS_INFO,
    DELETE_TOPIC_IN_BROKER,
    DELETE_TOPIC_IN_NAMESRV,
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER,
    CLEAN_UNUSED_TOPIC,
    DELETE_EXPIRED_COMMITLOG,
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
    DELETE_SUBSCRIPTIONGROUP,
    GET_CONSUME_STATS,
    LOCK_BATCH_MQ,
    UNLOCK_BATCH_MQ,
    CHECK_CLIENT_CONFIG,
    GET_CONSUMER_CONNECTION_LIST,
    GET_PRODUCER_CONNECTION_LIST,
    INVOKE_BROKER_TO_RESET_OFFSET,
    DELETE_TOPIC_IN_BROKER_LIST,
    DELETE_SUBSCRIPTIONGROUP_LIST,
    0,
    9999,
    -1,
    i16::MIN as i32,
];

/// What a header field holds.
#[derive(Clone, Copy)]
enum Kind {
    Num,
    /// A queue id.
    Queue,
    Topic,
    Group,
    Props,
    Sub,
    Flag,
    Text,
}

/// Topics: `topics.json` of the harness holds `Drained` (0 write queues) and
/// `Unsized` (no counts: RocketMQ's defaults).
pub const TOPICS: &[&str] = &[
    "T",
    "T",
    "Orders",
    "Drained",
    "Unsized",
    "%RETRY%g",
    "%DLQ%g",
    "TBW102",
    "",
    "bad topic",
    "a|b%c_d-e",
];

const NUMS: &[&str] = &[
    "0",
    "0",
    "1",
    "1",
    "2",
    "3",
    "-1",
    "-2",
    "15",
    "16",
    "17",
    "31",
    "32",
    "1024",
    "1025",
    "65535",
    "2147483647",
    "-2147483648",
    "2147483648",
    "4294967296",
    "9223372036854775807",
    "-9223372036854775808",
    "9223372036854775808",
    "72057594037927936",
    "72057594037927935",
    "144115188075855872",
    "1700000000000",
    " 7 ",
    "",
    "x",
    "1e3",
    "0x10",
    "+5",
];

const GROUPS: &[&str] = &["g", "g", "cg", "", "%", "a b", "x|y"];

const PROPS: &[&str] = &[
    "",
    "TAGS\u{1}a\u{2}KEYS\u{1}k1 k2\u{2}",
    "TAGS\u{1}b\u{2}",
    "KEYS\u{1}k1\u{2}UNIQ_KEY\u{1}0A0B\u{2}",
    "DELAY\u{1}3\u{2}WAIT\u{1}false\u{2}",
    "WAIT\u{1}true\u{2}",
    "__CRC32#\u{1}0000000000\u{2}",
    "\u{1}\u{2}\u{1}\u{1}\u{2}\u{2}",
    "KEYS\u{1}\u{2}",
];

const SUBS: &[&str] = &["*", "", "a", "a || b", "||", " || ", "*||a"];

const FLAGS: &[&str] = &[
    "0", "1", "2", "3", "4", "8", "12", "16", "32", "48", "-1", "true", "false",
];

/// Values a well-formed request would carry, by kind.
const PLAIN_NUMS: &[&str] = &["0", "0", "1", "2", "3", "-1", "32"];
const PLAIN_TOPICS: &[&str] = &["T", "T", "Orders", "Unsized", "Drained", "%RETRY%g"];
const PLAIN_FLAGS: &[&str] = &["0", "0", "1", "2", "3", "6"];

/// A field value of `kind`: when `plain`, what a well-behaved client sends (or a
/// learned value); otherwise anything from extreme to arbitrary.
fn value(g: &mut Gen, kind: Kind, seen: &[String], plain: bool) -> String {
    let choice = g.byte();
    let learned = matches!(kind, Kind::Num | Kind::Text) && !seen.is_empty();
    if plain {
        if learned && choice < 80 {
            return g.pick(seen);
        }
        return match kind {
            Kind::Num => g.pick(PLAIN_NUMS).to_string(),
            Kind::Queue => g.pick(&["0", "1", "2", "3"]).to_string(),
            Kind::Topic => g.pick(PLAIN_TOPICS).to_string(),
            Kind::Group => g.pick(&GROUPS[..3]).to_string(),
            Kind::Props => g.pick(&PROPS[..4]).to_string(),
            Kind::Sub => g.pick(&SUBS[..4]).to_string(),
            Kind::Flag => g.pick(PLAIN_FLAGS).to_string(),
            Kind::Text => g.pick(&["k1", "k2", "a", "10.0.0.1@1"]).to_string(),
        };
    }
    if choice < 40 {
        return g.text(24);
    }
    if choice < 70 && learned {
        return g.pick(seen);
    }
    match kind {
        Kind::Num | Kind::Queue => g.pick(NUMS).to_string(),
        Kind::Topic => {
            if choice == 255 {
                "t".repeat(128 + g.below(64))
            } else {
                g.pick(TOPICS).to_string()
            }
        }
        Kind::Group => g.pick(GROUPS).to_string(),
        Kind::Props => g.pick(PROPS).to_string(),
        Kind::Sub => g.pick(SUBS).to_string(),
        Kind::Flag => g.pick(FLAGS).to_string(),
        Kind::Text => g.text(40),
    }
}

const SEND_FIELDS: &[(&str, &str, Kind)] = &[
    ("producerGroup", "a", Kind::Group),
    ("topic", "b", Kind::Topic),
    ("defaultTopic", "c", Kind::Topic),
    ("defaultTopicQueueNums", "d", Kind::Num),
    ("queueId", "e", Kind::Queue),
    ("sysFlag", "f", Kind::Flag),
    ("bornTimestamp", "g", Kind::Num),
    ("flag", "h", Kind::Num),
    ("properties", "i", Kind::Props),
    ("reconsumeTimes", "j", Kind::Num),
    ("unitMode", "k", Kind::Flag),
    ("maxReconsumeTimes", "l", Kind::Num),
    ("batch", "m", Kind::Flag),
];

fn fields_of(code: i32) -> &'static [(&'static str, Kind)] {
    match code {
        CONSUMER_SEND_MSG_BACK => &[
            ("offset", Kind::Num),
            ("group", Kind::Group),
            ("delayLevel", Kind::Num),
            ("originMsgId", Kind::Text),
            ("maxReconsumeTimes", Kind::Num),
        ],
        PULL_MESSAGE | LITE_PULL_MESSAGE => &[
            ("consumerGroup", Kind::Group),
            ("topic", Kind::Topic),
            ("queueId", Kind::Queue),
            ("queueOffset", Kind::Num),
            ("maxMsgNums", Kind::Num),
            ("sysFlag", Kind::Flag),
            ("commitOffset", Kind::Num),
            ("suspendTimeoutMillis", Kind::Num),
            ("subscription", Kind::Sub),
            ("subVersion", Kind::Num),
        ],
        QUERY_MESSAGE => &[
            ("topic", Kind::Topic),
            ("key", Kind::Text),
            ("maxNum", Kind::Num),
            ("beginTimestamp", Kind::Num),
            ("endTimestamp", Kind::Num),
        ],
        VIEW_MESSAGE_BY_ID => &[("offset", Kind::Num)],
        UPDATE_AND_CREATE_TOPIC => &[
            ("topic", Kind::Topic),
            ("readQueueNums", Kind::Num),
            ("writeQueueNums", Kind::Num),
            ("perm", Kind::Flag),
        ],
        GET_MAX_OFFSET | GET_MIN_OFFSET | GET_EARLIEST_MSG_STORETIME => {
            &[("topic", Kind::Topic), ("queueId", Kind::Queue)]
        }
        SEARCH_OFFSET_BY_TIMESTAMP => &[
            ("topic", Kind::Topic),
            ("queueId", Kind::Queue),
            ("timestamp", Kind::Num),
        ],
        UNREGISTER_CLIENT => &[
            ("clientID", Kind::Text),
            ("consumerGroup", Kind::Group),
            ("producerGroup", Kind::Group),
        ],
        QUERY_CONSUMER_OFFSET => &[
            ("consumerGroup", Kind::Group),
            ("topic", Kind::Topic),
            ("queueId", Kind::Queue),
        ],
        UPDATE_CONSUMER_OFFSET => &[
            ("consumerGroup", Kind::Group),
            ("topic", Kind::Topic),
            ("queueId", Kind::Queue),
            ("commitOffset", Kind::Num),
        ],
        GET_CONSUMER_LIST_BY_GROUP => &[("consumerGroup", Kind::Group)],
        GET_ROUTEINFO_BY_TOPIC => &[("topic", Kind::Topic)],
        GET_TOPIC_STATS_INFO | DELETE_TOPIC_IN_BROKER | DELETE_TOPIC_IN_NAMESRV => {
            &[("topic", Kind::Topic)]
        }
        DELETE_SUBSCRIPTIONGROUP => &[("groupName", Kind::Group), ("cleanOffset", Kind::Text)],
        GET_CONSUME_STATS => &[("consumerGroup", Kind::Group), ("topic", Kind::Topic)],
        GET_CONSUMER_CONNECTION_LIST => &[("consumerGroup", Kind::Group)],
        GET_PRODUCER_CONNECTION_LIST => &[("producerGroup", Kind::Group)],
        INVOKE_BROKER_TO_RESET_OFFSET => &[
            ("topic", Kind::Topic),
            ("group", Kind::Group),
            ("timestamp", Kind::Num),
            ("isForce", Kind::Flag),
            ("queueId", Kind::Queue),
            ("offset", Kind::Num),
        ],
        _ => &[("topic", Kind::Topic), ("queueId", Kind::Queue)],
    }
}

/// A batch body (RocketMQ's `MessageDecoder.encodeMessages`) whose sizes and parts
/// come from `g`: sometimes exact, sometimes off.
fn batch_body(g: &mut Gen) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..g.below(4) {
        let body = g.bytes(64).to_vec();
        let props = value(g, Kind::Props, &[], false);
        let exact = 20 + body.len() + 2 + props.len();
        let size = match g.byte() % 8 {
            0 => g.pick(&[0i64, 21, 22, -1, i32::MAX as i64, exact as i64 + 1]),
            _ => exact as i64,
        };
        out.extend_from_slice(&(size as i32).to_be_bytes());
        out.extend_from_slice(&[0; 8]);
        out.extend_from_slice(&(g.byte() as i32).to_be_bytes());
        let blen = match g.byte() % 8 {
            0 => g.pick(&[-1i32, i32::MAX, body.len() as i32 + 1]),
            _ => body.len() as i32,
        };
        out.extend_from_slice(&blen.to_be_bytes());
        out.extend_from_slice(&body);
        let plen = match g.byte() % 8 {
            0 => g.pick(&[-1i16, i16::MAX, props.len() as i16 + 1]),
            _ => props.len() as i16,
        };
        out.extend_from_slice(&plen.to_be_bytes());
        out.extend_from_slice(props.as_bytes());
    }
    out
}

fn heartbeat_body(g: &mut Gen) -> Vec<u8> {
    if g.byte() < 64 {
        return g.bytes(128).to_vec();
    }
    let client = value(g, Kind::Text, &[], false);
    let groups: Vec<String> = (0..g.below(3))
        .map(|_| value(g, Kind::Group, &[], false))
        .collect();
    let consumers: Vec<serde_json::Value> = groups
        .iter()
        .map(|n| serde_json::json!({ "groupName": n, "subscriptionDataSet": [] }))
        .collect();
    let v = serde_json::json!({ "clientID": client, "consumerDataSet": consumers });
    serde_json::to_vec(&v).unwrap()
}

/// A JSON body the admin codes expect, its values from `g`.
fn admin_body(g: &mut Gen, code: i32, seen: &[String]) -> Vec<u8> {
    let topic = value(g, Kind::Topic, seen, true);
    let group = value(g, Kind::Group, seen, true);
    let v = match code {
        LOCK_BATCH_MQ | UNLOCK_BATCH_MQ => {
            let qs: Vec<serde_json::Value> = (0..g.below(4))
                .map(|_| {
                    serde_json::json!({"topic": topic, "brokerName": "b", "queueId": g.pick(&[0i64, 1, -1, i64::MAX])})
                })
                .collect();
            serde_json::json!({"consumerGroup": group, "clientId": g.text(8), "mqSet": qs})
        }
        DELETE_TOPIC_IN_BROKER_LIST => serde_json::json!({"topicList": [topic, g.text(8)]}),
        DELETE_SUBSCRIPTIONGROUP_LIST => {
            serde_json::json!({"groupNameList": [group], "cleanOffset": g.byte().is_multiple_of(2)})
        }
        CHECK_CLIENT_CONFIG => serde_json::json!({"group": group, "subscriptionData": {
            "topic": topic, "subString": g.text(8), "expressionType": g.pick(&["TAG", "SQL92", ""])}}),
        _ => serde_json::json!({"groupName": group, "retryMaxTimes": g.pick(&[0i64, -1, 16])}),
    };
    v.to_string().into_bytes()
}

/// One request from `g`; `seen` holds values learned from earlier responses.
pub fn request(g: &mut Gen, opaque: i32, seen: &[String]) -> RemotingCommand {
    let code = if g.byte() < 4 {
        g.u16() as i16 as i32
    } else {
        g.pick(CODES)
    };
    // Half the requests are what a client would send, so that they get past the
    // header checks into the store; the others are wild.
    let plain = g.byte().is_multiple_of(2);
    let absent = if plain { 32 } else { 8 };
    let mut fields = Vec::new();
    let send = matches!(code, SEND_MESSAGE | SEND_MESSAGE_V2 | SEND_BATCH_MESSAGE);
    if send {
        let short = code == SEND_MESSAGE_V2 && !g.byte().is_multiple_of(4);
        for (long, letter, kind) in SEND_FIELDS {
            if !g.byte().is_multiple_of(absent) {
                let name = if short { letter } else { long };
                fields.push((name.to_string(), value(g, *kind, seen, plain)));
            }
        }
    } else {
        for (name, kind) in fields_of(code) {
            if !g.byte().is_multiple_of(absent) {
                fields.push((name.to_string(), value(g, *kind, seen, plain)));
            }
        }
    }
    // Sometimes a field named at random, or one given twice.
    if !plain && g.byte().is_multiple_of(4) {
        let name = if g.byte().is_multiple_of(2) {
            fields.first().map_or_else(String::new, |(n, _)| n.clone())
        } else {
            g.text(8)
        };
        fields.insert(0, (name, value(g, Kind::Text, seen, false)));
    }
    let body: Vec<u8> = match code {
        SEND_BATCH_MESSAGE => batch_body(g),
        SEND_MESSAGE if g.byte().is_multiple_of(4) => batch_body(g),
        HEART_BEAT => heartbeat_body(g),
        LOCK_BATCH_MQ
        | UNLOCK_BATCH_MQ
        | CHECK_CLIENT_CONFIG
        | UPDATE_AND_CREATE_SUBSCRIPTIONGROUP
        | DELETE_TOPIC_IN_BROKER_LIST
        | DELETE_SUBSCRIPTIONGROUP_LIST
            if plain =>
        {
            admin_body(g, code, seen)
        }
        UPDATE_BROKER_CONFIG if plain => {
            let key = g.pick(&[
                "deleteWhen",
                "fileReservedTime",
                "diskMaxUsedSpaceRatio",
                "listenPort",
                "cleanResourceInterval",
            ]);
            format!("{key}={}\n", value(g, Kind::Num, seen, false)).into_bytes()
        }
        _ => g.bytes(96).to_vec(),
    };
    let mut req = RemotingCommand::request(code, opaque, fields);
    if g.byte().is_multiple_of(16) {
        req.flag = 2; // one-way
    }
    if g.byte().is_multiple_of(2) {
        req.serialize_type = SerializeType::RocketMq;
    }
    req.body = Bytes::from(body);
    req
}

/// Values worth reusing from a response: queue offsets, message ids and the
/// commit-log offsets they carry.
pub fn learn(resp: &RemotingCommand, seen: &mut Vec<String>) {
    for (name, value) in &resp.ext_fields {
        match name.as_str() {
            "msgId" => {
                for id in value.split(',') {
                    if let Some(hex) = id.get(16..32)
                        && let Ok(offset) = i64::from_str_radix(hex, 16)
                    {
                        seen.push(offset.to_string());
                    }
                    seen.push(id.to_string());
                }
            }
            "queueOffset" | "nextBeginOffset" | "maxOffset" | "offset" => seen.push(value.clone()),
            _ => {}
        }
    }
    if seen.len() > 64 {
        seen.drain(..seen.len() - 64);
    }
}

/// Whether `resp` is the node's answer to a request whose handler panicked.
pub fn is_panic_answer(resp: &RemotingCommand) -> bool {
    resp.code == SYSTEM_ERROR
        && resp
            .remark
            .as_deref()
            .is_some_and(|r| r.contains("the handler panicked"))
}
