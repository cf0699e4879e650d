//! Retention keeps a node taking writes on a small file system (issue 19's proof): a
//! node on a 64 MiB ext4 image (loop-mounted; needs root, prints SKIPPED otherwise) is
//! sent over twice the file system's size. Nothing is expired by age, so only the
//! space levels delete (force level, oldest first). Checked:
//! * sends are never refused for longer than a few cleaning passes in a row;
//! * the log's minimum only moves forward, and segments were deleted;
//! * every acknowledged message at or past each queue's minimum reads back
//!   identical, in order, and nothing was lost past it;
//! * `inspect check` is clean after the node shuts down (with `tools`).
#![cfg(feature = "node")]

mod common;
#[path = "common/remoting.rs"]
mod remoting;

use coremq::node::remoting::codes::*;
use coremq::node::{Network, Node, NodeConfig};
use coremq::{ShardedConfig, StoreConfig, StoredMessage};
use remoting::Client;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

const FS_MIB: u64 = 64;
const QUEUES: i32 = 2;
const BODY: usize = 16 << 10;

fn start(dir: &Path) -> Node {
    let cfg = NodeConfig {
        network: Network::Shards,
        data_dir: dir.to_path_buf(),
        listen: "127.0.0.1:0".parse().unwrap(),
        namesrv_enable: false,
        metrics_enable: false,
        shards: 1,
        pin: false,
        ..NodeConfig::default()
    };
    let mut store = ShardedConfig::new(dir);
    store.shards = 1;
    store.pin = false;
    store.io_memory_bytes = 8 << 20;
    store.store = StoreConfig::small_for_tests(dir);
    store.store.consume_queue_flush_interval = Duration::from_millis(50);
    store.store.disk_full_ratio = 0.85;
    let r = &mut store.store.retention;
    r.file_reserved_time = Duration::from_secs(3600);
    r.delete_when = String::new();
    r.disk_max_used_space_ratio = 0.5;
    r.disk_clean_forcibly_ratio = 0.6;
    r.clean_interval = Duration::from_millis(100);
    r.delete_interval = Duration::ZERO;
    Node::start_with_store(cfg, store).expect("node starts")
}

fn body(q: i32, n: u64) -> Vec<u8> {
    let mut b = vec![(n % 251) as u8; BODY];
    b[..8].copy_from_slice(&n.to_be_bytes());
    b[8..12].copy_from_slice(&q.to_be_bytes());
    b
}

fn send(c: &mut Client, q: i32, n: u64) -> (i32, Option<u64>) {
    let qs = q.to_string();
    let r = c.call(
        SEND_MESSAGE,
        &[
            ("producerGroup", "pg"),
            ("topic", "Fill"),
            ("defaultTopic", "TBW102"),
            ("defaultTopicQueueNums", "4"),
            ("queueId", &qs),
            ("sysFlag", "0"),
            ("bornTimestamp", "1700000000000"),
            ("flag", "0"),
            ("properties", ""),
            ("reconsumeTimes", "0"),
        ],
        &body(q, n),
    );
    let off = r.field("queueOffset").and_then(|v| v.parse().ok());
    (r.code, off)
}

fn records(b: &[u8]) -> Vec<StoredMessage> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 4 <= b.len() {
        let size = u32::from_be_bytes(b[at..at + 4].try_into().unwrap()) as usize;
        out.push(StoredMessage::decode(&bytes::Bytes::copy_from_slice(&b[at..at + size])).unwrap());
        at += size;
    }
    out
}

fn field_u64(r: &coremq::node::remoting::RemotingCommand, name: &str) -> u64 {
    r.field(name).unwrap().parse().unwrap()
}

#[test]
fn a_node_on_a_small_file_system_keeps_taking_writes() {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    let Some(_mount) = common::tiny_fs(&dir.path().join("img"), &mnt, FS_MIB) else {
        eprintln!("SKIPPED: cannot mount a loop filesystem here (needs root)");
        return;
    };
    let data = mnt.join("node");
    let node = start(&data);
    let mut c = Client::connect(node.broker_addr);
    c.ok(
        UPDATE_AND_CREATE_TOPIC,
        &[
            ("topic", "Fill"),
            ("readQueueNums", "2"),
            ("writeQueueNums", "2"),
        ],
        b"",
    );
    let target = 2 * (FS_MIB << 20) + (FS_MIB << 19);
    let (mut sent_bytes, mut n) = (0u64, 0u64);
    // queue -> queue offset -> message number, for every acknowledged send.
    let mut acked: BTreeMap<i32, BTreeMap<u64, u64>> = BTreeMap::new();
    let mut refused = 0u64;
    let mut refused_since: Option<Instant> = None;
    let mut longest_refusal = Duration::ZERO;
    let mut last_min = 0u64;
    let t0 = Instant::now();
    while sent_bytes < target {
        assert!(
            t0.elapsed() < Duration::from_secs(240),
            "too slow: {sent_bytes} bytes sent"
        );
        let q = (n % QUEUES as u64) as i32;
        let (code, off) = send(&mut c, q, n);
        if code == SUCCESS {
            acked.entry(q).or_default().insert(off.unwrap(), n);
            sent_bytes += BODY as u64;
            if let Some(since) = refused_since.take() {
                longest_refusal = longest_refusal.max(since.elapsed());
            }
        } else {
            refused += 1;
            let since = *refused_since.get_or_insert_with(Instant::now);
            assert!(
                since.elapsed() < Duration::from_secs(3),
                "sends refused for 3 s in a row after {} MiB (code {code})",
                sent_bytes >> 20
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        n += 1;
        if n % 500 == 0 {
            let r = c.ok(GET_MIN_OFFSET, &[("topic", "Fill"), ("queueId", "0")], b"");
            let min = field_u64(&r, "offset");
            assert!(
                min >= last_min,
                "a queue's minimum went back: {last_min} -> {min}"
            );
            last_min = min;
        }
    }
    if let Some(since) = refused_since {
        longest_refusal = longest_refusal.max(since.elapsed());
    }
    eprintln!(
        "sent {} MiB in {:?}; {refused} sends refused, longest refusal {longest_refusal:?}",
        sent_bytes >> 20,
        t0.elapsed()
    );
    assert!(
        longest_refusal < Duration::from_secs(3),
        "sends were refused for {longest_refusal:?} in a row"
    );
    // Retention settles first: the last sends can leave the file system over its
    // level, and passes (every 100 ms) delete until it is under; a pass that deleted
    // while the queues below were read would move a minimum under the reader.
    let mins = |c: &mut Client| -> Vec<u64> {
        (0..QUEUES)
            .map(|q| {
                let qs = q.to_string();
                field_u64(
                    &c.ok(GET_MIN_OFFSET, &[("topic", "Fill"), ("queueId", &qs)], b""),
                    "offset",
                )
            })
            .collect()
    };
    let settle = Instant::now();
    let (mut last, mut since) = (mins(&mut c), Instant::now());
    while since.elapsed() < Duration::from_secs(1) {
        assert!(
            settle.elapsed() < Duration::from_secs(60),
            "retention kept deleting for 60 s after the sends"
        );
        std::thread::sleep(Duration::from_millis(50));
        let now = mins(&mut c);
        if now != last {
            (last, since) = (now, Instant::now());
        }
    }
    // Everything acknowledged from each queue's minimum on is there, in order.
    let mut kept = 0;
    for (q, offs) in &acked {
        let qs = q.to_string();
        let min = field_u64(
            &c.ok(GET_MIN_OFFSET, &[("topic", "Fill"), ("queueId", &qs)], b""),
            "offset",
        );
        let max = field_u64(
            &c.ok(GET_MAX_OFFSET, &[("topic", "Fill"), ("queueId", &qs)], b""),
            "offset",
        );
        assert!(min > 0, "queue {q}: retention deleted its oldest messages");
        assert_eq!(
            max,
            offs.keys().next_back().unwrap() + 1,
            "queue {q}: its end"
        );
        let mut at = min;
        while at < max {
            let off = at.to_string();
            let r = c.call(
                PULL_MESSAGE,
                &[
                    ("consumerGroup", "cg"),
                    ("topic", "Fill"),
                    ("queueId", &qs),
                    ("queueOffset", &off),
                    ("maxMsgNums", "32"),
                    ("sysFlag", "0"),
                    ("commitOffset", "0"),
                    ("suspendTimeoutMillis", "0"),
                    ("subscription", "*"),
                    ("subVersion", "0"),
                ],
                b"",
            );
            assert_eq!(r.code, SUCCESS, "queue {q} at {at}: {:?}", r.remark);
            for m in records(&r.body) {
                let want = offs[&m.queue_offset];
                assert_eq!(
                    m.body,
                    body(*q, want),
                    "queue {q} offset {}",
                    m.queue_offset
                );
                assert_eq!(m.queue_offset, at, "queue {q}: no gap");
                at += 1;
                kept += 1;
            }
        }
    }
    assert!(kept > 0);
    node.shutdown().unwrap();
    #[cfg(feature = "tools")]
    {
        let rep = coremq::tools::inspect::check(&data.join("shard-0")).unwrap();
        assert!(rep.is_clean(), "inspect check: {:?}", rep.problems);
    }
}
