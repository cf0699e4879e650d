//! The node's durability contract, tested by killing it: with `flush = "sync"` a send
//! is answered once its message is on disk (written and `fdatasync`ed), whichever
//! shard answers it (the connection's, or the one owning the queue, which answers
//! routed sends itself: `node::shared_out`). A `coremq serve` killed with SIGKILL in
//! the middle of sends over both shards' queues is started again on its directory:
//! every answered send is there, at the offset its answer gave, with its body.
#![cfg(feature = "node")]

#[path = "common/remoting.rs"]
mod remoting;

use coremq::node::remoting::codes::*;
use remoting::Client;
use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

const QUEUES: i32 = 4;

fn free() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A `coremq serve` child, killed when dropped (a failing test leaves no node running).
struct Node(std::process::Child);

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `coremq serve` on `data` with a sync-flush config, and its broker address once it
/// accepts.
fn serve(dir: &std::path::Path, data: &std::path::Path) -> (Node, SocketAddr) {
    let broker = free();
    let cfg = dir.join("coremq.toml");
    std::fs::write(
        &cfg,
        "shards = 2\npin = false\nflush = \"sync\"\ndefault_queue_nums = 4\n\
         namesrv_enable = false\nmetrics_enable = false\nha_listen = \"127.0.0.1:0\"\n",
    )
    .unwrap();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_coremq"))
        .arg("serve")
        .arg("--config")
        .arg(&cfg)
        .arg("--data-dir")
        .arg(data)
        .arg("--listen")
        .arg(broker.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let child = Node(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(broker).is_err() {
        assert!(Instant::now() < deadline, "node did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    (child, broker)
}

fn send_fields(queue: &str) -> [(&'static str, String); 10] {
    [
        ("producerGroup", "pg".into()),
        ("topic", "Killed".into()),
        ("defaultTopic", "TBW102".into()),
        ("defaultTopicQueueNums", "4".into()),
        ("queueId", queue.into()),
        ("sysFlag", "0".into()),
        ("bornTimestamp", "1700000000000".into()),
        ("flag", "0".into()),
        ("properties", "".into()),
        ("reconsumeTimes", "0".into()),
    ]
}

#[test]
fn every_answered_sync_send_survives_a_kill_of_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    for round in 0..3 {
        let (mut child, broker) = serve(dir.path(), &data);
        let pid = child.0.id() as i32;
        let killer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300 + 150 * round));
            // SAFETY: sending a signal to the child this test started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        });
        // Answered sends: (queue, offset) -> body.
        let mut answered: BTreeMap<(i32, u64), String> = BTreeMap::new();
        let mut c = Client::connect(broker);
        for i in 0.. {
            let q = (i % QUEUES).to_string();
            let body = format!("round {round} send {i}");
            let fields = send_fields(&q);
            let fields: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
            match c.try_call(SEND_MESSAGE, &fields, body.as_bytes()) {
                Ok(r) if r.code == SUCCESS => {
                    let off: u64 = r.field("queueOffset").unwrap().parse().unwrap();
                    let q: i32 = r.field("queueId").unwrap().parse().unwrap();
                    assert!(
                        answered.insert((q, off), body).is_none(),
                        "offset answered twice"
                    );
                }
                Ok(r) => panic!("send {i} refused: {} {:?}", r.code, r.remark),
                Err(_) => break,
            }
        }
        killer.join().unwrap();
        child.0.wait().unwrap();
        assert!(
            answered.len() > 10,
            "round {round}: only {} sends answered",
            answered.len()
        );
        let by_queue = (0..QUEUES).filter(|q| answered.keys().any(|(aq, _)| aq == q));
        assert_eq!(
            by_queue.count(),
            QUEUES as usize,
            "sends to every queue answered"
        );

        // Started again on the same directory: every answered send is there.
        let (mut again, broker) = serve(dir.path(), &data);
        let mut c = Client::connect(broker);
        for q in 0..QUEUES {
            let stored = remoting::read_queue(&mut c, "g", "Killed", q, 0);
            let at: BTreeMap<u64, String> = stored
                .iter()
                .map(|m| {
                    (
                        m.queue_offset,
                        String::from_utf8_lossy(&m.body).into_owned(),
                    )
                })
                .collect();
            for ((aq, off), body) in answered.iter().filter(|((aq, _), _)| *aq == q) {
                assert_eq!(
                    at.get(off),
                    Some(body),
                    "round {round}: queue {aq} offset {off} answered but not stored as sent"
                );
            }
        }
        drop(c);
        // SAFETY: sending a signal to the child this test started.
        unsafe { libc::kill(again.0.id() as i32, libc::SIGTERM) };
        assert!(again.0.wait().unwrap().success());
    }
}
