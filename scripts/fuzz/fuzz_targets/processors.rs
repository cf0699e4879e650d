//! The node's request processors (issue 16: one request with a negative queue id
//! divided by zero and took a shard down). Each input builds up to 12 requests with
//! the generator `tests/processors.rs` uses (`tests/requests/mod.rs`, included by
//! path) and serves them through `Node::serve_request` to two in-process nodes on a
//! temporary directory, one per front end, kept across inputs (the store fills up as
//! a real one would; values learned from responses feed later requests). libFuzzer's
//! panic hook aborts on any panic in any thread, so a handler panic the node would
//! catch and answer still counts as a crash, as does a dead shard, a missing answer, an
//! answer to a one-way request, or a wrong opaque.
#![no_main]

#[path = "../../../tests/requests/mod.rs"]
mod requests;

use coremq::node::{Network, Node};
use libfuzzer_sys::fuzz_target;
use requests::{Gen, is_panic_answer, learn, request, start_node};
use std::sync::{Mutex, OnceLock};

struct Nodes {
    nodes: [Node; 2],
    seen: Vec<String>,
}

fn nodes() -> &'static Mutex<Nodes> {
    static NODES: OnceLock<Mutex<Nodes>> = OnceLock::new();
    NODES.get_or_init(|| {
        let root =
            std::env::temp_dir().join(format!("coremq-fuzz-processors-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        Mutex::new(Nodes {
            nodes: [
                start_node(&root.join("shards"), Network::Shards),
                start_node(&root.join("threads"), Network::Threads),
            ],
            seen: Vec::new(),
        })
    })
}

fuzz_target!(|data: &[u8]| {
    let mut guard = nodes().lock().unwrap_or_else(|p| p.into_inner());
    let Nodes { nodes, seen } = &mut *guard;
    let mut g = Gen::new(data);
    for opaque in 0..12 {
        if g.is_empty() {
            break;
        }
        let node = &nodes[g.below(2)];
        let shard = g.below(2);
        let req = request(&mut g, opaque, seen);
        let answer = node
            .serve_request(shard, req.clone())
            .unwrap_or_else(|e| panic!("{e} serving {req:?}"));
        match answer {
            None => assert!(req.is_oneway(), "no answer to {req:?}"),
            Some(resp) => {
                assert!(!req.is_oneway(), "an answer to one-way {req:?}");
                assert!(resp.is_response());
                assert_eq!(resp.opaque, req.opaque);
                assert!(!is_panic_answer(&resp), "{req:?} -> {:?}", resp.remark);
                learn(&resp, seen);
            }
        }
    }
    for node in nodes.iter() {
        assert_eq!(node.failure(), None);
    }
});
