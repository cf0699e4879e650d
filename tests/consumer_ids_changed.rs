//! NOTIFY_CONSUMER_IDS_CHANGED (40, issue 19): when a consumer group's member set
//! changes, the broker sends every member's connection a one-way request with header
//! `consumerGroup`, as RocketMQ's `DefaultConsumerIdsChangeListener` does, so the
//! members rebalance at once. Proves, on both front ends: a second client joining
//! tells the first; a repeated heartbeat with nothing new tells nobody; a changed
//! subscription, an unregister and a closed connection each tell the rest; members of
//! other groups hear nothing; a group configured with
//! `notifyConsumerIdsChangedEnable: false` is never told.
#![cfg(feature = "node")]

#[path = "common/remoting.rs"]
mod remoting;

use coremq::node::remoting::RemotingCommand;
use coremq::node::remoting::codes::*;
use coremq::node::{Network, Node};
use remoting::Client;
use std::path::Path;
use std::time::Duration;

/// How long a test waits to be sure no notice comes.
const QUIET: Duration = Duration::from_millis(300);

fn start(dir: &Path, network: Network) -> Node {
    remoting::start_node(dir, network)
}

fn heartbeat(c: &mut Client, id: &str, group: &str, topic: &str) {
    let hb = serde_json::json!({
        "clientID": id,
        "consumerDataSet": [{"groupName": group, "consumeType": "CONSUME_PASSIVELY",
            "messageModel": "CLUSTERING", "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
            "subscriptionDataSet": [{"topic": topic, "subString": "*", "expressionType": "TAG"}]}],
        "producerDataSet": [],
    });
    c.ok(HEART_BEAT, &[], hb.to_string().as_bytes());
}

/// The next notice the broker sent `c`, which must be a one-way 40 for `group`.
fn told(c: &mut Client, group: &str, what: &str) -> RemotingCommand {
    let f = c
        .next_incoming(Duration::from_secs(5))
        .unwrap_or_else(|| panic!("{what}: no NOTIFY_CONSUMER_IDS_CHANGED came"));
    assert_eq!(f.code, NOTIFY_CONSUMER_IDS_CHANGED, "{what}");
    assert!(f.is_oneway(), "{what}: a notice is one-way");
    assert_eq!(f.field("consumerGroup"), Some(group), "{what}");
    f
}

fn quiet(c: &mut Client, what: &str) {
    if let Some(f) = c.next_incoming(QUIET) {
        panic!("{what}: unexpected request {} {:?}", f.code, f.ext_fields);
    }
}

fn membership_changes_are_told(network: Network) {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path(), network);
    let mut first = Client::connect(node.broker_addr);
    heartbeat(&mut first, "c@1", "G", "T");
    told(
        &mut first,
        "G",
        "the joiner itself, as RocketMQ tells every channel",
    );
    let mut other = Client::connect(node.broker_addr);
    heartbeat(&mut other, "o@1", "H", "T");
    told(&mut other, "H", "the other group's own join");

    // The second joins: the first hears of it, and so does the second.
    let mut second = Client::connect(node.broker_addr);
    heartbeat(&mut second, "c@2", "G", "T");
    told(&mut first, "G", "a second client joined");
    told(&mut second, "G", "a second client joined (itself)");

    // The same heartbeat again changes nothing.
    heartbeat(&mut first, "c@1", "G", "T");
    heartbeat(&mut second, "c@2", "G", "T");
    quiet(&mut first, "repeated heartbeats");
    quiet(&mut second, "repeated heartbeats");

    // A new subscription is a change.
    heartbeat(&mut second, "c@2", "G", "U");
    told(&mut first, "G", "the second resubscribed");
    told(&mut second, "G", "the second resubscribed (itself)");

    // Unregistering tells the rest.
    second.ok(
        UNREGISTER_CLIENT,
        &[("clientID", "c@2"), ("consumerGroup", "G")],
        b"",
    );
    told(&mut first, "G", "the second unregistered");
    quiet(&mut second, "an unregistered client is no member");

    // A closed connection tells the rest.
    heartbeat(&mut second, "c@2", "G", "T");
    told(&mut first, "G", "the second joined again");
    told(&mut second, "G", "the second joined again (itself)");
    drop(second);
    told(&mut first, "G", "the second's connection closed");
    quiet(&mut other, "group H never changed after its own join");

    // A group configured not to be told.
    first.ok(
        UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
        &[],
        br#"{"groupName":"Q","notifyConsumerIdsChangedEnable":false}"#,
    );
    heartbeat(&mut first, "q@1", "Q", "T");
    let mut late = Client::connect(node.broker_addr);
    heartbeat(&mut late, "q@2", "Q", "T");
    quiet(&mut first, "notifyConsumerIdsChangedEnable false");
    quiet(&mut late, "notifyConsumerIdsChangedEnable false");
    node.shutdown().unwrap();
}

#[test]
fn membership_changes_are_told_shards() {
    membership_changes_are_told(Network::Shards);
}

#[test]
fn membership_changes_are_told_threads() {
    membership_changes_are_told(Network::Threads);
}
