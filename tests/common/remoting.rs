//! A small blocking RocketMQ remoting client for node tests: requests and responses by
//! opaque, and requests the broker sends on its own (CHECK_TRANSACTION_STATE) kept
//! aside for the test to read. Included with
//! `#[path = "common/remoting.rs"] mod remoting;`.
#![allow(dead_code)]

use bytes::Bytes;
use coremq::node::remoting::codes::*;
use coremq::node::remoting::{RemotingCommand, SerializeType, decode_payload};
use coremq::node::{Network, Node, NodeConfig};
use coremq::{ShardedConfig, StoreConfig, StoredMessage};
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// A node of 2 unpinned shards in `dir` on ephemeral loopback ports, with the small
/// test store.
pub fn start_node(dir: &std::path::Path, network: Network) -> Node {
    start_node_with(dir, network, |_| {})
}

/// [`start_node`] with `set` applied to the node's settings first.
pub fn start_node_with(
    dir: &std::path::Path,
    network: Network,
    set: impl FnOnce(&mut NodeConfig),
) -> Node {
    let mut cfg = NodeConfig {
        network,
        data_dir: dir.to_path_buf(),
        listen: "127.0.0.1:0".parse().unwrap(),
        namesrv_listen: "127.0.0.1:0".parse().unwrap(),
        // Never the fixed default: shutdown wakes its listener by connecting to it.
        metrics_listen: "127.0.0.1:0".parse().unwrap(),
        shards: 2,
        pin: false,
        ..NodeConfig::default()
    };
    set(&mut cfg);
    let mut store = ShardedConfig::new(dir);
    store.shards = 2;
    store.pin = false;
    store.io_memory_bytes = 8 << 20;
    store.store = StoreConfig::small_for_tests(dir);
    Node::start_with_store(cfg, store).expect("node starts")
}

pub struct Client {
    s: TcpStream,
    opaque: i32,
    /// Requests the broker sent (not answers to ours), oldest first.
    pub incoming: VecDeque<RemotingCommand>,
    /// The language this client's requests name (the node's default when `None`).
    pub language: Option<String>,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        Client::on_stream(TcpStream::connect(addr).unwrap())
    }

    /// A client on an open connection: one it made, or one a test accepted (a fake
    /// name server's, whose frames it reads with [`Client::read_frame`] and answers
    /// with [`Client::write`]).
    pub fn on_stream(s: TcpStream) -> Client {
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        Client {
            s,
            opaque: 0,
            incoming: VecDeque::new(),
            language: None,
        }
    }

    /// The next frame the peer sends.
    pub fn read_frame(&mut self) -> std::io::Result<RemotingCommand> {
        let mut len = [0u8; 4];
        self.s.read_exact(&mut len)?;
        let mut payload = vec![0u8; u32::from_be_bytes(len) as usize];
        self.s.read_exact(&mut payload)?;
        Ok(decode_payload(payload.into()).expect("the node sends well-formed frames"))
    }

    pub fn write(&mut self, c: &RemotingCommand) {
        self.s.write_all(&c.encode()).unwrap();
    }

    fn build(&mut self, code: i32, fields: &[(&str, &str)], body: &[u8]) -> RemotingCommand {
        self.opaque += 1;
        let mut c = RemotingCommand::request(
            code,
            self.opaque,
            fields
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        c.body = Bytes::copy_from_slice(body);
        c.serialize_type = SerializeType::Json;
        if let Some(l) = &self.language {
            c.language = l.clone();
        }
        c
    }

    /// Sends a request and waits for its response (broker requests meanwhile are kept).
    pub fn call(&mut self, code: i32, fields: &[(&str, &str)], body: &[u8]) -> RemotingCommand {
        let c = self.build(code, fields, body);
        let opaque = c.opaque;
        self.write(&c);
        loop {
            let f = self.read_frame().expect("a response");
            if !f.is_response() {
                self.incoming.push_back(f);
            } else if f.opaque == opaque {
                return f;
            }
        }
    }

    /// [`Client::call`], or the error that ended the connection.
    pub fn try_call(
        &mut self,
        code: i32,
        fields: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<RemotingCommand> {
        let c = self.build(code, fields, body);
        let opaque = c.opaque;
        self.s.write_all(&c.encode())?;
        loop {
            let f = self.read_frame()?;
            if !f.is_response() {
                self.incoming.push_back(f);
            } else if f.opaque == opaque {
                return Ok(f);
            }
        }
    }

    /// Writes a request without waiting (its opaque: the next of this client's).
    pub fn write_request(&mut self, code: i32, fields: &[(&str, &str)], body: &[u8]) -> i32 {
        let c = self.build(code, fields, body);
        self.write(&c);
        c.opaque
    }

    /// The next frame the node sends (a response or a request of its own).
    pub fn next_frame(&mut self) -> RemotingCommand {
        self.read_frame().expect("a frame")
    }

    /// A second handle on the socket (to write from one thread and read on another).
    pub fn socket(&self) -> TcpStream {
        self.s.try_clone().unwrap()
    }

    /// Sends a one-way request.
    /// [`Client::call`], asserting the answer is SUCCESS.
    pub fn ok(&mut self, code: i32, fields: &[(&str, &str)], body: &[u8]) -> RemotingCommand {
        let r = self.call(code, fields, body);
        assert_eq!(r.code, SUCCESS, "code {code}: {:?}", r.remark);
        r
    }

    pub fn oneway(&mut self, code: i32, fields: &[(&str, &str)], body: &[u8]) {
        let mut c = self.build(code, fields, body);
        c.flag |= 2;
        self.write(&c);
    }

    /// Waits up to `limit` for a request from the broker.
    pub fn next_incoming(&mut self, limit: Duration) -> Option<RemotingCommand> {
        if let Some(c) = self.incoming.pop_front() {
            return Some(c);
        }
        let start = Instant::now();
        self.s
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let got = loop {
            match self.read_frame() {
                Ok(f) if !f.is_response() => break Some(f),
                Ok(_) => {}
                Err(_) if start.elapsed() < limit => {}
                Err(_) => break None,
            }
        };
        self.s
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        got
    }
}

/// A SEND_MESSAGE (code 10) with `props` (name, value) pairs; returns the response.
pub fn send(
    c: &mut Client,
    group: &str,
    topic: &str,
    q: i32,
    body: &[u8],
    props: &[(&str, &str)],
    sys_flag: i32,
) -> RemotingCommand {
    let props: String = props
        .iter()
        .map(|(n, v)| format!("{n}\u{1}{v}\u{2}"))
        .collect();
    let (q, flag) = (q.to_string(), sys_flag.to_string());
    c.call(
        SEND_MESSAGE,
        &[
            ("producerGroup", group),
            ("topic", topic),
            ("defaultTopic", "TBW102"),
            ("defaultTopicQueueNums", "4"),
            ("queueId", &q),
            ("sysFlag", &flag),
            ("bornTimestamp", "1700000000000"),
            ("flag", "0"),
            ("properties", &props),
            ("reconsumeTimes", "0"),
        ],
        body,
    )
}

/// A pull of up to 32 messages from `offset` (held up to `suspend_ms` when > 0).
pub fn pull(
    c: &mut Client,
    group: &str,
    topic: &str,
    q: i32,
    offset: u64,
    suspend_ms: u64,
) -> RemotingCommand {
    let (q, offset, suspend) = (q.to_string(), offset.to_string(), suspend_ms.to_string());
    let sys_flag = if suspend_ms > 0 { "2" } else { "0" };
    c.call(
        PULL_MESSAGE,
        &[
            ("consumerGroup", group),
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

/// Splits a pull body into decoded records.
pub fn records(body: &[u8]) -> Vec<StoredMessage> {
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

/// Every message of a queue from `from` (pulls without holding).
pub fn read_queue(
    c: &mut Client,
    group: &str,
    topic: &str,
    q: i32,
    from: u64,
) -> Vec<StoredMessage> {
    let mut out = Vec::new();
    let mut off = from;
    loop {
        let r = pull(c, group, topic, q, off, 0);
        if r.code != SUCCESS {
            return out;
        }
        out.extend(records(&r.body));
        off = r.field("nextBeginOffset").unwrap().parse().unwrap();
    }
}

/// The commit-log offset an offset message id names (its last 16 hex digits).
pub fn offset_of(msg_id: &str) -> i64 {
    i64::from_str_radix(&msg_id[16..32], 16).unwrap()
}
