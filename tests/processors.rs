//! The node's request processors under random requests (issue 16: one request with a
//! negative queue id took a shard down). Thousands of requests built from random bytes
//! (`tests/requests/mod.rs`: every served code, header fields absent, extreme,
//! learned from earlier responses or arbitrary; damaged batches and heartbeats) go
//! through `Node::serve_request` to two in-process nodes on temporary directories, one
//! per front end (`shards`: processors on the shard executors, in-place store calls;
//! `threads`: through the handle). Every request must get exactly its answer (none
//! when one-way), no handler may panic (the node would answer "the handler panicked"),
//! no shard may die, and both nodes must shut down cleanly afterwards.
//!
//! `scripts/fuzz.sh processors` drives the same generator coverage-guided.
#![cfg(feature = "node")]

mod requests;

use coremq::node::{Network, Node};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use requests::{Gen, is_panic_answer, learn, request, start_node};
use std::io::{Read, Write};

/// Requests one case may build (a case's bytes usually run out sooner).
const MAX_REQUESTS_PER_CASE: usize = 12;

fn request_panics(node: &Node) -> u64 {
    let mut m = std::net::TcpStream::connect(node.metrics_addr.unwrap()).unwrap();
    m.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut text = String::new();
    m.read_to_string(&mut text).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("coremq_request_panics_total "))
        .expect("the counter is exported");
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// Runs the requests `bytes` builds; fails on a missing, extra or panicked answer, or
/// a dead shard.
fn run_case(nodes: &[Node], bytes: &[u8], seen: &mut Vec<String>) -> Result<(), TestCaseError> {
    let mut g = Gen::new(bytes);
    for opaque in 0..MAX_REQUESTS_PER_CASE as i32 {
        if g.is_empty() {
            break;
        }
        let node = &nodes[g.below(nodes.len())];
        let shard = g.below(2);
        let req = request(&mut g, opaque, seen);
        let answer = node
            .serve_request(shard, req.clone())
            .map_err(|e| TestCaseError::fail(format!("{e} serving {req:?}")))?;
        match answer {
            None => prop_assert!(req.is_oneway(), "no answer to {req:?}"),
            Some(resp) => {
                prop_assert!(!req.is_oneway(), "an answer to one-way {req:?}: {resp:?}");
                prop_assert!(resp.is_response());
                prop_assert_eq!(resp.opaque, req.opaque);
                prop_assert_eq!(resp.serialize_type, req.serialize_type);
                prop_assert!(!is_panic_answer(&resp), "{req:?}\n-> {:?}", resp.remark);
                learn(&resp, seen);
            }
        }
    }
    for node in nodes {
        prop_assert_eq!(node.failure(), None);
        let h = node.handle();
        prop_assert!((0..h.shards()).all(|i| h.is_alive(i)));
    }
    Ok(())
}

#[test]
fn random_requests_never_panic_nor_lose_a_shard() {
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let nodes = [
        start_node(dirs[0].path(), Network::Shards),
        start_node(dirs[1].path(), Network::Threads),
    ];
    let seen = std::cell::RefCell::new(Vec::new());
    let config = Config {
        cases: 1000,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let bytes = proptest::collection::vec(any::<u8>(), 0..512);
    let t0 = std::time::Instant::now();
    let result = runner.run(&bytes, |b| run_case(&nodes, &b, &mut seen.borrow_mut()));
    println!("1000 cases in {:?}", t0.elapsed());
    if let Err(e) = result {
        panic!("{e}");
    }
    for node in &nodes {
        assert_eq!(request_panics(node), 0);
    }
    for node in nodes {
        node.shutdown()
            .expect("a clean shutdown after the random requests");
    }
}
