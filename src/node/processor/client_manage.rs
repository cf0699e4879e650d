//! RocketMQ's `ClientManageProcessor`: `HEART_BEAT` (34, a client names the consumer
//! and producer groups it belongs to) and `UNREGISTER_CLIENT` (35). A producer group's
//! connections are where transaction check-backs go.
//!
//! Group membership is kept by the connection that sent the heartbeat: it ends when
//! that connection closes, the client unregisters, or no heartbeat came for
//! `client_expiry_ms` (RocketMQ: 120 s). Each change of a consumer group's members (a
//! client joining, leaving, or changing its subscriptions) is told to the group's
//! clients with NOTIFY_CONSUMER_IDS_CHANGED (`broker2client.rs`), as RocketMQ's
//! `ConsumerManager` calls its `ConsumerIdsChangeListener`.

use super::{NodeState, Reject, field, ok, reject};
use crate::node::broker2client;
use crate::node::remoting::RemotingCommand;
use crate::node::remoting::codes::*;
use serde_json::Value;

pub(super) fn heartbeat(
    st: &NodeState,
    req: &RemotingCommand,
    conn: u64,
    peer: std::net::SocketAddr,
) -> Result<RemotingCommand, Reject> {
    let v: Value = serde_json::from_slice(&req.body)
        .map_err(|e| reject(SYSTEM_ERROR, format!("bad heartbeat body: {e}")))?;
    let client = v
        .get("clientID")
        .and_then(Value::as_str)
        .ok_or_else(|| reject(SYSTEM_ERROR, "heartbeat without clientID"))?;
    let groups: Vec<String> = v
        .get("consumerDataSet")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("groupName").and_then(Value::as_str))
        .map(str::to_string)
        .collect();
    let mut changed = st.clients.heartbeat(conn, client, &groups);
    let producers: Vec<String> = v
        .get("producerDataSet")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("groupName").and_then(Value::as_str))
        .map(str::to_string)
        .collect();
    st.producers.heartbeat(conn, client, &producers);
    for g in super::admin_group::note_connection(st, req, conn, peer) {
        if !changed.contains(&g) {
            changed.push(g);
        }
    }
    broker2client::consumer_ids_changed(st, &changed, "a client joined or resubscribed");
    Ok(ok(req))
}

pub(super) fn unregister(st: &NodeState, req: &RemotingCommand) -> Result<RemotingCommand, Reject> {
    let client = field(req, "clientID")?;
    if let Some(g) = req.field("consumerGroup")
        && st.clients.unregister(client, g)
    {
        broker2client::consumer_ids_changed(st, &[g.to_string()], "a client unregistered");
    }
    if let Some(g) = req.field("producerGroup") {
        st.producers.unregister(client, g);
    }
    Ok(ok(req))
}
