//! RocketMQ's `ConsumerManageProcessor`: `QUERY_CONSUMER_OFFSET` (14),
//! `UPDATE_CONSUMER_OFFSET` (15) and `GET_CONSUMER_LIST_BY_GROUP` (38).
//!
//! Offsets live in memory and reach `config/consumerOffset.json` every
//! `offset_flush_interval_ms` and at shutdown (RocketMQ's `ConsumerOffsetManager`).
//! A group with no offset on a queue that still starts at 0 begins at 0, as in
//! RocketMQ; on a queue whose head was removed it gets `QUERY_NOT_FOUND` and the client
//! applies its own start policy.

use super::{NodeState, Reject, clip, field, num, ok, queue_args, reject, store_error};
use crate::StoreOps;
use crate::node::remoting::RemotingCommand;
use crate::node::remoting::codes::*;
use serde_json::json;

pub(super) async fn query_consumer_offset(
    st: &NodeState,
    req: &RemotingCommand,
) -> Result<RemotingCommand, Reject> {
    let group = field(req, "consumerGroup")?;
    let (topic, q) = queue_args(req)?;
    if let Some(o) = st.offsets.get(group, &topic, q) {
        return Ok(ok(req).with_field("offset", o));
    }
    // RocketMQ: a group with no offset on a queue that still starts at 0 begins at 0.
    let (min, _) = st
        .handle
        .queue_offsets(&topic, q)
        .await
        .map_err(store_error)?;
    if min == 0 {
        return Ok(ok(req).with_field("offset", 0));
    }
    Err(reject(
        QUERY_NOT_FOUND,
        "Not found, maybe this group consumer boot first",
    ))
}

pub(super) fn update_consumer_offset(
    st: &NodeState,
    req: &RemotingCommand,
) -> Result<RemotingCommand, Reject> {
    let group = field(req, "consumerGroup")?;
    let (topic, q) = queue_args(req)?;
    let o: i64 = num(req, "commitOffset")?;
    if o < 0 {
        return Err(reject(SYSTEM_ERROR, format!("negative commitOffset {o}")));
    }
    st.offsets.set(group, &topic, q, o as u64);
    Ok(ok(req))
}

pub(super) fn consumer_list(
    st: &NodeState,
    req: &RemotingCommand,
) -> Result<RemotingCommand, Reject> {
    let group = field(req, "consumerGroup")?;
    let ids = st.clients.members(group);
    if ids.is_empty() {
        return Err(reject(
            SYSTEM_ERROR,
            format!("no consumer for this group, {}", clip(group)),
        ));
    }
    let body = json!({ "consumerIdList": ids });
    Ok(ok(req).with_body(serde_json::to_vec(&body).unwrap_or_default()))
}
