//! A send whose queue another shard owns is answered by that shard on the client's
//! connection (`node::shared_out`), while the connection's own shard answers the rest
//! through its writer: the two must never interleave bytes of their frames, lose an
//! answer, answer twice, or store twice.
#![cfg(feature = "node")]

#[path = "common/remoting.rs"]
mod remoting;

use bytes::Bytes;
use coremq::node::Network;
use coremq::node::remoting::codes::*;
use coremq::node::remoting::{RemotingCommand, SerializeType};
use remoting::Client;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;

/// The queues of a topic the node creates (its `default_queue_nums`), over both shards.
const QUEUES: i32 = 4;

fn send_frame(topic: &str, opaque: i32, q: i32, body_len: usize) -> Vec<u8> {
    let q = q.to_string();
    let fields = [
        ("producerGroup", "pg"),
        ("topic", topic),
        ("defaultTopic", "TBW102"),
        ("defaultTopicQueueNums", "4"),
        ("queueId", q.as_str()),
        ("sysFlag", "0"),
        ("bornTimestamp", "1700000000000"),
        ("flag", "0"),
        ("properties", ""),
        ("reconsumeTimes", "0"),
    ];
    let mut c = RemotingCommand::request(
        SEND_MESSAGE,
        opaque,
        fields
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    c.serialize_type = SerializeType::Json;
    c.body = Bytes::from(vec![b'x'; body_len]);
    c.encode()
}

/// Thousands of sends over both shards' queues written back to back on one
/// connection, faster than they are answered (the answers pile up in the socket, so
/// the owners' direct writes meet a full socket and a busy writer): every one is
/// answered exactly once, every answer decodes whole, and each queue's offsets are
/// 0..n, each once.
#[test]
fn pipelined_sends_over_both_shards_are_each_answered_once_and_intact() {
    pipelined_sends(true);
}

/// The same with routed sends handed back to the connection's shard to answer
/// (`owner_answers_routed_sends = false`).
#[test]
fn pipelined_sends_answered_by_the_connections_shard() {
    pipelined_sends(false);
}

fn pipelined_sends(owner_answers: bool) {
    const SENDS: i32 = 6000;
    let dir = tempfile::tempdir().unwrap();
    let node = remoting::start_node_with(dir.path(), Network::Shards, |c| {
        c.owner_answers_routed_sends = owner_answers;
    });
    let mut c = Client::connect(node.broker_addr);
    // Creates the topic with its 8 queues before the burst.
    let first = remoting::send(&mut c, "pg", "Routed", 0, b"first", &[], 0);
    assert_eq!(first.code, SUCCESS, "{:?}", first.remark);
    let mut socket = c.socket();
    let writer = std::thread::spawn(move || {
        let mut wire = Vec::new();
        for i in 1..=SENDS {
            // Opaques of their own (this client's `call`s use 1, 2, ...).
            wire.extend(send_frame(
                "Routed",
                1_000_000 + i,
                i % QUEUES,
                1 + (i as usize * 37) % 2048,
            ));
            if wire.len() > 256 << 10 {
                socket.write_all(&wire).unwrap();
                wire.clear();
            }
        }
        socket.write_all(&wire).unwrap();
    });
    let mut seen = BTreeSet::new();
    let mut offsets: BTreeMap<i32, Vec<u64>> = BTreeMap::new();
    while seen.len() < SENDS as usize {
        let r = c.next_frame();
        if !r.is_response() {
            continue;
        }
        assert_eq!(r.code, SUCCESS, "opaque {}: {:?}", r.opaque, r.remark);
        assert!(seen.insert(r.opaque), "opaque {} answered twice", r.opaque);
        let q: i32 = r.field("queueId").unwrap().parse().unwrap();
        let off: u64 = r.field("queueOffset").unwrap().parse().unwrap();
        offsets.entry(q).or_default().push(off);
    }
    writer.join().unwrap();
    assert_eq!(
        seen,
        (1_000_001..=1_000_000 + SENDS).collect::<BTreeSet<_>>()
    );
    for q in 0..QUEUES {
        let mut got = offsets.remove(&q).unwrap_or_default();
        got.sort_unstable();
        let first = u64::from(q == 0);
        let want: Vec<u64> = (first..first + got.len() as u64).collect();
        assert_eq!(got, want, "queue {q}'s offsets");
    }
    // And they read back: as many records as answers, per queue.
    for q in 0..QUEUES {
        let n = remoting::read_queue(&mut c, "g", "Routed", q, 0).len();
        let answered = (1..=SENDS).filter(|i| i % QUEUES == q).count() + usize::from(q == 0);
        assert_eq!(n, answered, "queue {q}");
    }
    drop(c);
    node.shutdown().unwrap();
}

/// A client that closes its connection with routed sends still unanswered: the node
/// goes on serving (a new connection sends over both shards) and shuts down cleanly;
/// the owners' answers to the closed connection are dropped.
#[test]
fn a_connection_closed_with_routed_sends_in_flight_leaves_the_node_serving() {
    let dir = tempfile::tempdir().unwrap();
    let node = remoting::start_node(dir.path(), Network::Shards);
    for round in 0..20 {
        let mut c = Client::connect(node.broker_addr);
        let first = remoting::send(&mut c, "pg", "Closing", 0, b"first", &[], 0);
        assert_eq!(first.code, SUCCESS, "round {round}: {:?}", first.remark);
        let mut wire = Vec::new();
        for i in 1..=500 {
            wire.extend(send_frame("Closing", 1_000_000 + i, i % QUEUES, 512));
        }
        c.socket().write_all(&wire).unwrap();
        // Closed at once, most answers not yet written (or not yet read).
        drop(c);
    }
    let mut c = Client::connect(node.broker_addr);
    for q in 0..QUEUES {
        let r = remoting::send(&mut c, "pg", "Closing", q, b"after", &[], 0);
        assert_eq!(r.code, SUCCESS, "queue {q}: {:?}", r.remark);
    }
    drop(c);
    node.shutdown().unwrap();
}
