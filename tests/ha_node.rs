//! Two nodes on loopback, a master and its slave (issue 17), driven over RocketMQ's
//! remoting protocol by a small blocking client written here: sends to the master
//! (SYNC_MASTER: SUCCESS once the slave has them), a send to the slave refused
//! (SERVICE_NOT_AVAILABLE, slave mode), pulls and key queries served by the slave, the
//! slave's copy of the master's topics and consumer offsets (codes 21 and 43), the
//! slave's route naming it broker id 1, and `coremq inspect check` clean on both.
use bytes::Bytes;
use coremq::node::remoting::codes::*;
use coremq::node::remoting::{RemotingCommand, decode_payload};
use coremq::node::{Node, NodeConfig};
use coremq::{ShardedConfig, StoreConfig, StoredMessage};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

fn start(dir: &Path, tweak: impl FnOnce(&mut NodeConfig)) -> Node {
    let mut cfg = NodeConfig {
        data_dir: dir.to_path_buf(),
        listen: "127.0.0.1:0".parse().unwrap(),
        namesrv_listen: "127.0.0.1:0".parse().unwrap(),
        metrics_enable: false,
        shards: 2,
        pin: false,
        offset_flush_interval_ms: 100,
        ha_heartbeat_interval_ms: 200,
        ha_housekeeping_interval_ms: 3000,
        ha_reconnect_interval_ms: 100,
        slave_sync_interval_ms: 200,
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

    fn call(&mut self, code: i32, fields: &[(&str, &str)], body: &[u8]) -> RemotingCommand {
        self.opaque += 1;
        let fields = fields
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let c = RemotingCommand::request(code, self.opaque, fields)
            .with_body(Bytes::copy_from_slice(body));
        self.s.write_all(&c.encode()).unwrap();
        let mut len = [0u8; 4];
        self.s.read_exact(&mut len).unwrap();
        let mut payload = vec![0u8; u32::from_be_bytes(len) as usize];
        self.s.read_exact(&mut payload).unwrap();
        let r = decode_payload(payload.into()).unwrap();
        assert_eq!(r.opaque, self.opaque);
        r
    }
}

fn send(c: &mut Client, topic: &str, q: i32, body: &str, key: &str) -> RemotingCommand {
    let props = format!("KEYS\u{1}{key}\u{2}");
    let q = q.to_string();
    c.call(
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
        ],
        body.as_bytes(),
    )
}

fn pull(c: &mut Client, topic: &str, q: i32, offset: u64) -> RemotingCommand {
    let (q, offset) = (q.to_string(), offset.to_string());
    c.call(
        PULL_MESSAGE,
        &[
            ("consumerGroup", "cg"),
            ("topic", topic),
            ("queueId", &q),
            ("queueOffset", &offset),
            ("maxMsgNums", "32"),
            ("sysFlag", "0"),
            ("commitOffset", "0"),
            ("suspendTimeoutMillis", "0"),
            ("subscription", "*"),
        ],
        b"",
    )
}

fn records(body: &[u8]) -> Vec<StoredMessage> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < body.len() {
        let size = u32::from_be_bytes(body[at..at + 4].try_into().unwrap()) as usize;
        out.push(StoredMessage::decode(&Bytes::copy_from_slice(&body[at..at + size])).unwrap());
        at += size;
    }
    out
}

fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn master_and_slave_nodes_over_the_protocol() {
    let dir = tempfile::tempdir().unwrap();
    let (mdir, sdir) = (dir.path().join("master"), dir.path().join("slave"));
    let master = start(&mdir, |c| c.role = "SYNC_MASTER".into());
    let (mbroker, mha) = (master.broker_addr, master.ha_addr.expect("HA port"));
    let slave = start(&sdir, |c| {
        c.role = "slave".into();
        c.ha_master_address = Some(mha);
        c.ha_master_broker_address = Some(mbroker);
    });
    let mut m = Client::connect(mbroker);
    let mut s = Client::connect(slave.broker_addr);
    // SYNC_MASTER: SUCCESS once the slave acknowledged (it may take a moment to connect).
    eventually("the slave to be in sync", || {
        send(&mut m, "HaNode", 0, "probe", "probe").code == SUCCESS
    });
    for i in 0..20 {
        let q = i % 4;
        let r = send(&mut m, "HaNode", q, &format!("body-{i}"), &format!("k{i}"));
        assert_eq!(r.code, SUCCESS, "{:?}", r.remark);
    }
    // A slave takes no sends.
    let r = send(&mut s, "HaNode", 0, "refused", "x");
    assert_eq!(r.code, SERVICE_NOT_AVAILABLE);
    assert!(r.remark.unwrap_or_default().contains("slave mode"));
    // The slave serves pulls and key queries of what the master acknowledged.
    let mut got = Vec::new();
    for q in 0..4 {
        let r = pull(&mut s, "HaNode", q, 0);
        assert_eq!(r.code, SUCCESS, "queue {q}: {:?}", r.remark);
        got.extend(records(&r.body));
    }
    // Probes answered SLAVE_NOT_AVAILABLE were stored too (and replicated later).
    for i in 0..20 {
        let b = format!("body-{i}");
        assert!(
            got.iter().any(|m| m.body[..] == *b.as_bytes()),
            "{b} not on the slave"
        );
    }
    let r = s.call(
        QUERY_MESSAGE,
        &[
            ("topic", "HaNode"),
            ("key", "k7"),
            ("maxNum", "4"),
            ("beginTimestamp", "0"),
            ("endTimestamp", &i64::MAX.to_string()),
        ],
        b"",
    );
    assert_eq!(r.code, SUCCESS, "{:?}", r.remark);
    assert_eq!(String::from_utf8_lossy(&records(&r.body)[0].body), "body-7");
    // Consumer offsets and topics are copied from the master.
    let r = m.call(
        UPDATE_CONSUMER_OFFSET,
        &[
            ("consumerGroup", "cg"),
            ("topic", "HaNode"),
            ("queueId", "2"),
            ("commitOffset", "3"),
        ],
        b"",
    );
    assert_eq!(r.code, SUCCESS);
    let all = m.call(GET_ALL_CONSUMER_OFFSET, &[], b"");
    assert_eq!(all.code, SUCCESS);
    assert!(
        String::from_utf8_lossy(&all.body).contains("\"HaNode@cg\":{2:3}"),
        "fastjson shape: {}",
        String::from_utf8_lossy(&all.body)
    );
    eventually("the slave to copy the offset", || {
        let r = s.call(
            QUERY_CONSUMER_OFFSET,
            &[
                ("consumerGroup", "cg"),
                ("topic", "HaNode"),
                ("queueId", "2"),
            ],
            b"",
        );
        r.code == SUCCESS && r.field("offset") == Some("3")
    });
    let topics = s.call(GET_ALL_TOPIC_CONFIG, &[], b"");
    assert!(String::from_utf8_lossy(&topics.body).contains("\"HaNode\""));
    // The slave names itself broker id 1 in its routes.
    let route = s.call(GET_ROUTEINFO_BY_TOPIC, &[("topic", "HaNode")], b"");
    let v: serde_json::Value = serde_json::from_slice(&route.body).unwrap();
    assert!(v["brokerDatas"][0]["brokerAddrs"]["1"].is_string(), "{v}");
    drop((m, s));
    slave.shutdown().unwrap();
    master.shutdown().unwrap();
    for d in [&mdir, &sdir] {
        let mut out = Vec::new();
        assert!(
            coremq::tools::inspect::print_check(d, &mut out).unwrap(),
            "{}",
            String::from_utf8_lossy(&out)
        );
    }
    // `coremq ha truncate` on the stopped slave: an offset inside a record is refused
    // (exit 2, nothing changed); a record's start cuts from there, the bytes kept in
    // lost+found, and the store reopens without that record.
    let newest = got.iter().max_by_key(|m| m.log_offset).unwrap();
    let truncate = |to: u64| {
        std::process::Command::new(env!("CARGO_BIN_EXE_coremq"))
            .args(["ha", "truncate", "--data-dir"])
            .arg(&sdir)
            .args(["--to", &to.to_string()])
            .output()
            .unwrap()
    };
    let bad = truncate(newest.log_offset + 1);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("inside the record"),
        "{bad:?}"
    );
    let cut = truncate(newest.log_offset);
    assert!(cut.status.success(), "{cut:?}");
    let v: serde_json::Value = serde_json::from_slice(&cut.stdout).unwrap();
    assert!(
        v["kept_bytes"].as_u64().unwrap() >= newest.size as u64,
        "{v}"
    );
    assert!(Path::new(v["lost_found"].as_str().unwrap()).exists());
    let mut cfg = ShardedConfig::new(&sdir);
    cfg.shards = 2;
    cfg.pin = false;
    cfg.store = StoreConfig::small_for_tests(&sdir);
    let reopened = coremq::ShardedStore::open(cfg).unwrap();
    let h = reopened.handle();
    use coremq::StoreOps;
    let gone = futures_lite::future::block_on(h.look_by_offset(newest.log_offset)).unwrap();
    assert!(gone.is_none(), "the cut record is gone");
    let (_, max) =
        futures_lite::future::block_on(h.queue_offsets("HaNode", newest.queue_id)).unwrap();
    assert_eq!(max, newest.queue_offset, "its queue ends before it");
    reopened.shutdown().unwrap();
}

/// A master and its slave, both with shard ports (`shard_listen`): each shard of the
/// slave is the slave (broker id 1) of the master's shard broker of the same name, and
/// serves pulls of that shard's queues under the shard broker's own queue ids; sends to
/// it are refused; SYNC_MASTER sends on each master shard port are acknowledged once
/// that shard's slave has them.
#[test]
fn master_and_slave_nodes_with_shard_ports() {
    const TOPIC: &str = "HaShards";
    let dir = tempfile::tempdir().unwrap();
    let (mdir, sdir) = (dir.path().join("master"), dir.path().join("slave"));
    let ports = |c: &mut NodeConfig| c.shard_listen = Some("127.0.0.1:0".parse().unwrap());
    let master = start(&mdir, |c| {
        c.role = "SYNC_MASTER".into();
        ports(c);
    });
    let (mbroker, mha) = (master.broker_addr, master.ha_addr.expect("HA port"));
    let slave = start(&sdir, |c| {
        c.role = "slave".into();
        c.ha_master_address = Some(mha);
        c.ha_master_broker_address = Some(mbroker);
        ports(c);
    });
    assert_eq!(master.shard_addrs.len(), 2);
    assert_eq!(slave.shard_addrs.len(), 2);
    let mut m = Client::connect(mbroker);
    let r = m.call(
        UPDATE_AND_CREATE_TOPIC,
        &[
            ("topic", TOPIC),
            ("readQueueNums", "6"),
            ("writeQueueNums", "6"),
            ("perm", "6"),
        ],
        b"",
    );
    assert_eq!(r.code, SUCCESS, "{:?}", r.remark);

    // The master's route: a broker per shard, and how many queues each holds.
    let route = m.call(GET_ROUTEINFO_BY_TOPIC, &[("topic", TOPIC)], b"");
    let route: serde_json::Value = serde_json::from_slice(&route.body).unwrap();
    let mut brokers = Vec::new();
    for qd in route["queueDatas"].as_array().unwrap() {
        let name = qd["brokerName"].as_str().unwrap().to_string();
        let shard: usize = name.rsplit('-').next().unwrap().parse().unwrap();
        let n = qd["writeQueueNums"].as_i64().unwrap() as i32;
        brokers.push((shard, name, n));
    }
    brokers.sort();
    assert_eq!(brokers.len(), 2, "{route}");
    assert_eq!(brokers.iter().map(|b| b.2).sum::<i32>(), 6, "{route}");

    // SYNC_MASTER on each shard port: SUCCESS once that shard's slave is in sync.
    for &(shard, _, _) in &brokers {
        let mut c = Client::connect(master.shard_addrs[shard]);
        eventually("the shard's slave to be in sync", || {
            send(&mut c, TOPIC, 0, "probe", "probe").code == SUCCESS
        });
    }
    for &(shard, _, n) in &brokers {
        let mut c = Client::connect(master.shard_addrs[shard]);
        for local in 0..n {
            let body = format!("s{shard}-q{local}");
            let r = send(&mut c, TOPIC, local, &body, &body);
            assert_eq!(r.code, SUCCESS, "{body}: {:?}", r.remark);
        }
    }

    // Each slave shard port serves its shard's queues under the same local ids, once
    // the slave copied the topic's settings (every `slave_sync_interval_ms`).
    let mut s = Client::connect(slave.broker_addr);
    eventually("the slave to copy the topic", || {
        let r = s.call(GET_ALL_TOPIC_CONFIG, &[], b"");
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
        v["topicConfigTable"][TOPIC]["readQueueNums"] == 6
    });
    for &(shard, _, n) in &brokers {
        let mut c = Client::connect(slave.shard_addrs[shard]);
        for local in 0..n {
            let body = format!("s{shard}-q{local}");
            let r = pull(&mut c, TOPIC, local, 0);
            assert_eq!(r.code, SUCCESS, "{body}: {:?}", r.remark);
            let got = records(&r.body);
            assert!(
                got.iter().any(|m| m.body[..] == *body.as_bytes()),
                "{body} not on the slave's shard broker"
            );
            assert!(
                got.iter()
                    .all(|m| m.body.starts_with(b"probe") || m.body[..] == *body.as_bytes()),
                "only queue {local}'s messages on {shard}'s queue {local}"
            );
        }
        let r = send(&mut c, TOPIC, 0, "refused", "x");
        assert_eq!(r.code, SERVICE_NOT_AVAILABLE, "{:?}", r.remark);
    }

    // The slave's route names the same shard brokers, itself as their broker id 1.
    let route = s.call(GET_ROUTEINFO_BY_TOPIC, &[("topic", TOPIC)], b"");
    assert_eq!(route.code, SUCCESS, "{:?}", route.remark);
    let route: serde_json::Value = serde_json::from_slice(&route.body).unwrap();
    for &(shard, ref name, _) in &brokers {
        let bd = route["brokerDatas"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["brokerName"] == name.as_str())
            .unwrap_or_else(|| panic!("{name} in the slave's route: {route}"));
        let addr: SocketAddr = bd["brokerAddrs"]["1"]
            .as_str()
            .unwrap_or_else(|| panic!("{name} has broker id 1: {route}"))
            .parse()
            .unwrap();
        assert_eq!(addr, slave.shard_addrs[shard]);
    }
    drop((m, s));
    slave.shutdown().unwrap();
    master.shutdown().unwrap();
}
