//! Shard ports (`shard_listen`, `node::shard_view`): each shard answers as a broker of
//! its own, `<broker_name>-<shard>`, numbering the queues it owns from 0. A client that
//! follows the route sends every message to the shard owning its queue: no send is
//! handed between shards, the ids it sees are its broker's own, and what it stores is
//! where the node's own port (global ids) finds it.
#![cfg(feature = "node")]

#[path = "common/remoting.rs"]
mod remoting;

use coremq::node::remoting::codes::*;
use coremq::node::shard_view::ShardView;
use coremq::node::{Network, NodeConfig};
use coremq::shard::Ownership;
use remoting::{Client, pull, records, send, start_node_with};
use serde_json::Value;
use std::net::SocketAddr;

const TOPIC: &str = "ShardPortTopic";

/// RocketMQ's `MessageQueue` JSON, as the node writes map keys (fastjson's order).
fn coremq_mq_key(broker: &str, topic: &str, queue_id: i32) -> String {
    format!("{{\"brokerName\":\"{broker}\",\"queueId\":{queue_id},\"topic\":\"{topic}\"}}")
}
const QUEUES: i32 = 7;

fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("{name} not in /metrics")) as u64
}

fn metrics(addr: SocketAddr) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn every_send_goes_to_its_queues_shard_under_the_shard_brokers_own_ids() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node_with(dir.path(), Network::Shards, |c| {
        c.shard_listen = Some("127.0.0.1:0".parse().unwrap());
    });
    assert_eq!(node.shard_addrs.len(), 2);
    let mut main = Client::connect(node.broker_addr);
    let q = QUEUES.to_string();
    main.ok(
        UPDATE_AND_CREATE_TOPIC,
        &[
            ("topic", TOPIC),
            ("readQueueNums", &q),
            ("writeQueueNums", &q),
            ("perm", "6"),
        ],
        b"",
    );

    // The route names each shard as a broker holding its own queues.
    let mut ns = Client::connect(node.namesrv_addr.unwrap());
    let r = ns.ok(GET_ROUTEINFO_BY_TOPIC, &[("topic", TOPIC)], b"");
    let route: Value = serde_json::from_slice(&r.body).unwrap();
    let queues = route["queueDatas"].as_array().unwrap();
    assert_eq!(queues.len(), 2, "{route}");
    let mut total = 0;
    let mut brokers = Vec::new();
    for qd in queues {
        let name = qd["brokerName"].as_str().unwrap().to_string();
        let shard: usize = name.rsplit('-').next().unwrap().parse().unwrap();
        let view = ShardView::new(shard, 2, Ownership::TopicPlusQueue).unwrap();
        let n = qd["writeQueueNums"].as_i64().unwrap() as i32;
        assert_eq!(n, view.topic(TOPIC).count(QUEUES));
        assert_eq!(qd["readQueueNums"].as_i64().unwrap() as i32, n);
        total += n;
        let bd = route["brokerDatas"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["brokerName"] == name.as_str())
            .expect("broker data for each queue data");
        let addr: SocketAddr = bd["brokerAddrs"]["0"].as_str().unwrap().parse().unwrap();
        assert_eq!(addr, node.shard_addrs[shard]);
        brokers.push((shard, view, n, addr));
    }
    assert_eq!(
        total, QUEUES,
        "the shard brokers' queues add up to the topic's"
    );
    let info = ns.ok(GET_BROKER_CLUSTER_INFO, &[], b"");
    let info: Value = serde_json::from_slice(&info.body).unwrap();
    assert_eq!(
        info["brokerAddrTable"].as_object().unwrap().len(),
        2,
        "{info}"
    );

    // Send to every local queue of every shard broker, on its own port.
    let routed_before = metric(
        &metrics(node.metrics_addr.unwrap()),
        "coremq_routed_sends_total",
    );
    for &(shard, view, n, addr) in &brokers {
        let mut c = Client::connect(addr);
        for local in 0..n {
            let body = format!("shard{shard}-local{local}");
            let r = send(
                &mut c,
                "pg",
                TOPIC,
                local,
                body.as_bytes(),
                &[("KEYS", "sp-key")],
                0,
            );
            assert_eq!(r.code, SUCCESS, "{:?}", r.remark);
            assert_eq!(r.field("queueId"), Some(local.to_string().as_str()));
            // Read back on the node's port by the global id it maps to (a held pull:
            // the queue's entry is dispatched after the answer).
            let global = view.global(TOPIC, local).unwrap();
            assert_eq!(node.handle().shard_of(TOPIC, global), shard);
            let got = records(&pull(&mut main, "cg", TOPIC, global, 0, 5000).body);
            assert_eq!(got.len(), 1, "global queue {global}");
            assert_eq!(got[0].body.as_ref(), body.as_bytes());
            // And on the shard's port by its own id.
            let got = records(&pull(&mut c, "cg", TOPIC, local, 0, 5000).body);
            assert_eq!(got.len(), 1);
            assert_eq!(got[0].body.as_ref(), body.as_bytes());
        }
        // A queue past the shard broker's count is refused, naming the broker.
        let r = send(&mut c, "pg", TOPIC, n, b"x", &[], 0);
        assert_eq!(r.code, SYSTEM_ERROR);
        let remark = r.remark.unwrap_or_default();
        assert!(
            remark.contains(&format!("-{shard}")) && remark.contains("illegal"),
            "{remark}"
        );
        // A negative id picks one of the shard's own queues.
        let r = send(&mut c, "pg", TOPIC, -1, b"any", &[], 0);
        assert_eq!(r.code, SUCCESS);
        let picked: i32 = r.field("queueId").unwrap().parse().unwrap();
        assert!((0..n).contains(&picked), "{picked} of {n}");

        // Queue offsets and consumer offsets in the shard broker's ids.
        let local = 0;
        let global = view.global(TOPIC, local).unwrap().to_string();
        let max = c.ok(GET_MAX_OFFSET, &[("topic", TOPIC), ("queueId", "0")], b"");
        let main_max = main.ok(
            GET_MAX_OFFSET,
            &[("topic", TOPIC), ("queueId", &global)],
            b"",
        );
        assert_eq!(max.field("offset"), main_max.field("offset"));
        let fields = [
            ("consumerGroup", "cg"),
            ("topic", TOPIC),
            ("queueId", "0"),
            ("commitOffset", "1"),
        ];
        c.ok(UPDATE_CONSUMER_OFFSET, &fields, b"");
        // The group's committed offset of this queue, asked on the node's port.
        let committed_on_main = |main: &mut Client| {
            let fields = [
                ("consumerGroup", "cg"),
                ("topic", TOPIC),
                ("queueId", global.as_str()),
            ];
            main.ok(QUERY_CONSUMER_OFFSET, &fields, b"")
                .field("offset")
                .map(str::to_owned)
        };
        assert_eq!(committed_on_main(&mut main).as_deref(), Some("1"));

        // Topic and consume stats list the shard broker's own queues, under its name.
        let broker = format!("\"{}\"", ShardView::broker_name("coremq-broker-a", shard));
        let stats = c.ok(GET_TOPIC_STATS_INFO, &[("topic", TOPIC)], b"");
        let stats = String::from_utf8(stats.body.to_vec()).unwrap();
        assert_eq!(
            stats.matches("\"maxOffset\"").count(),
            n as usize,
            "{stats}"
        );
        assert_eq!(stats.matches(&broker).count(), n as usize, "{stats}");
        let progress = c.ok(
            GET_CONSUME_STATS,
            &[("consumerGroup", "cg"), ("topic", TOPIC)],
            b"",
        );
        let progress = String::from_utf8(progress.body.to_vec()).unwrap();
        assert_eq!(
            progress.matches("\"brokerOffset\"").count(),
            n as usize,
            "{progress}"
        );
        let queue0 = coremq_mq_key(&ShardView::broker_name("coremq-broker-a", shard), TOPIC, 0);
        let first = format!("{queue0}:{{\"brokerOffset\":");
        assert!(progress.contains(&first), "{first} in {progress}");
        assert!(progress.contains("\"consumerOffset\":1"), "{progress}");

        // A reset through the shard broker resets its queues, answered in its ids; the
        // node's port sees the offsets under the node's ids.
        let reset = c.ok(
            INVOKE_BROKER_TO_RESET_OFFSET,
            &[
                ("topic", TOPIC),
                ("group", "cg"),
                ("timestamp", "-1"),
                ("isForce", "true"),
            ],
            b"",
        );
        let reset = String::from_utf8(reset.body.to_vec()).unwrap();
        assert_eq!(reset.matches(&broker).count(), n as usize, "{reset}");
        assert!(
            reset.contains(&format!("{queue0}:{}", max.field("offset").unwrap())),
            "{reset}"
        );
        assert_eq!(committed_on_main(&mut main).as_deref(), max.field("offset"));
    }
    // A query by key answers each shard broker's own messages (a client asks every
    // broker and joins the answers); the node's port answers them all.
    let query = |c: &mut Client| {
        let r = c.call(
            QUERY_MESSAGE,
            &[
                ("topic", TOPIC),
                ("key", "sp-key"),
                ("maxNum", "64"),
                ("beginTimestamp", "0"),
                ("endTimestamp", "9999999999999"),
            ],
            b"",
        );
        assert_eq!(r.code, SUCCESS, "{:?}", r.remark);
        records(&r.body)
    };
    for &(shard, _, n, addr) in &brokers {
        let got = query(&mut Client::connect(addr));
        assert_eq!(got.len(), n as usize, "shard {shard}");
        assert!(
            got.iter()
                .all(|m| node.handle().shard_of(TOPIC, m.queue_id) == shard)
        );
    }
    assert_eq!(query(&mut main).len(), QUEUES as usize);
    let routed_after = metric(
        &metrics(node.metrics_addr.unwrap()),
        "coremq_routed_sends_total",
    );
    assert_eq!(
        routed_after, routed_before,
        "no send on a shard port is handed to another shard"
    );

    // The node's own port still routes (and counts it): some queue is the other shard's.
    for global in 0..QUEUES {
        send(&mut main, "pg", TOPIC, global, b"main", &[], 0);
    }
    let routed = metric(
        &metrics(node.metrics_addr.unwrap()),
        "coremq_routed_sends_total",
    );
    assert!(
        routed > routed_after,
        "sends on the node's port to both shards: some routed"
    );
    node.shutdown().unwrap();
}

#[test]
fn shard_ports_need_the_shard_front_end() {
    let cfg = NodeConfig {
        network: Network::Threads,
        shard_listen: Some("127.0.0.1:0".parse().unwrap()),
        ..NodeConfig::default()
    };
    let e = cfg.validate().unwrap_err().to_string();
    assert!(e.contains("shard_listen"), "{e}");
}

/// The load generator follows the route as a RocketMQ client does: a connection per
/// shard broker, each send to its queue's shard (none handed between shards), every
/// message acknowledged and read back on the node's own port; with one request in
/// flight, still one in all (a single thread over both connections).
#[test]
fn the_load_generator_follows_the_route_to_each_shard() {
    use coremq::tools::loadgen::{LoadConfig, remote};
    let dir = tempfile::tempdir().unwrap();
    let node = start_node_with(dir.path(), Network::Shards, |c| {
        c.shard_listen = Some("127.0.0.1:0".parse().unwrap());
    });
    let target = node.broker_addr.to_string();
    for outstanding in [1, 8] {
        let cfg = LoadConfig {
            messages: Some(400),
            producers: 2,
            outstanding,
            queues: 5,
            topics: 2,
            consumers: true,
            follow_route: true,
            quiet: true,
            ..LoadConfig::default()
        };
        let (report, good) = remote::run(&cfg, &target).unwrap();
        assert!(good, "{report}");
        assert_eq!(report["messages_acknowledged"], 400, "{report}");
        let mut brokers: Vec<SocketAddr> = report["brokers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_str().unwrap().parse().unwrap())
            .collect();
        brokers.sort();
        let mut want = node.shard_addrs.clone();
        want.sort();
        assert_eq!(brokers, want, "{report}");
    }
    let routed = metric(
        &metrics(node.metrics_addr.unwrap()),
        "coremq_routed_sends_total",
    );
    assert_eq!(
        routed, 0,
        "a send of the route-following client was handed between shards"
    );
    node.shutdown().unwrap();
}

/// With `namesrv_addr` set, each shard registers with the name server as its own
/// broker at its own port, naming its own queue counts.
#[test]
fn each_shard_registers_as_a_broker_of_its_own() {
    let fake_ns = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let ns_addr = fake_ns.local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("config")).unwrap();
    std::fs::write(
        dir.path().join("config/topics.json"),
        r#"{"topicConfigTable":{"Known":{"readQueueNums":5,"writeQueueNums":5,"perm":6}}}"#,
    )
    .unwrap();
    let node = start_node_with(dir.path(), Network::Shards, |c| {
        c.shard_listen = Some("127.0.0.1:0".parse().unwrap());
        c.namesrv_addr = vec![ns_addr.to_string()];
        c.register_interval_ms = 60_000;
    });
    let (s, _) = fake_ns.accept().unwrap();
    let mut ns = Client::on_stream(s);
    let mut seen = Vec::new();
    for _ in 0..2 {
        let req = ns.read_frame().unwrap();
        assert_eq!(req.code, REGISTER_BROKER);
        let name = req.field("brokerName").unwrap().to_string();
        let shard: usize = name.rsplit('-').next().unwrap().parse().unwrap();
        let addr: SocketAddr = req.field("brokerAddr").unwrap().parse().unwrap();
        assert_eq!(addr, node.shard_addrs[shard]);
        let body: Value = serde_json::from_slice(&req.body).unwrap();
        let known = &body["topicConfigSerializeWrapper"]["topicConfigTable"]["Known"];
        let view = ShardView::new(shard, 2, Ownership::TopicPlusQueue).unwrap();
        assert_eq!(
            known["writeQueueNums"],
            view.topic("Known").count(5),
            "{body}"
        );
        seen.push(shard);
        ns.write(&coremq::node::remoting::RemotingCommand::response_to(
            &req, SUCCESS, None,
        ));
    }
    seen.sort();
    assert_eq!(seen, vec![0, 1]);
    node.shutdown().unwrap();
}
