//! RocketMQ's `QueryMessageProcessor`: `QUERY_MESSAGE` (12, by key through the
//! IndexFiles of every shard, newest first) and `VIEW_MESSAGE_BY_ID` (33, by the
//! commit-log offset a RocketMQ offset message id carries).
//!
//! Both answer with raw records, as RocketMQ does; a commit-log offset names its shard
//! (shard `i`'s log starts at `i << 56`), so a lookup reads one shard only, and an
//! offset beyond the last shard is answered as not found without asking any shard.
//!
//! On a shard's own port (`node::shard_view`) a query by key answers that shard
//! broker's messages only: a client asks every broker of the route and joins the
//! answers, so the node's whole answer on each port would come back once per shard.

use super::{NodeState, Reject, field, num, ok, opt_num, reject, store_error};
use crate::StoreOps;
use crate::node::remoting::RemotingCommand;
use crate::node::remoting::codes::*;
use crate::node::shard_view::ShardView;
use crate::shard::shard_of_offset;
use bytes::Bytes;

async fn read_raw(st: &NodeState, offset: u64) -> Result<Option<Bytes>, Reject> {
    let shard = shard_of_offset(offset);
    if shard >= st.handle.shards() {
        return Ok(None);
    }
    st.handle
        .run_on(shard, move |ctx| async move {
            ctx.store.read_record(offset).await
        })
        .await
        .and_then(|r| r)
        .map_err(store_error)
}

pub(super) async fn query_message(
    st: &NodeState,
    req: &RemotingCommand,
    view: Option<ShardView>,
) -> Result<RemotingCommand, Reject> {
    let topic = field(req, "topic")?;
    let key = field(req, "key")?;
    let max: i64 = opt_num(req, "maxNum")?.unwrap_or(32);
    let begin: i64 = opt_num(req, "beginTimestamp")?.unwrap_or(0);
    let end: i64 = opt_num(req, "endTimestamp")?.unwrap_or(i64::MAX);
    let mut hits = st
        .handle
        .query_by_key(topic, key, max.max(0) as usize, begin, end)
        .await
        .map_err(store_error)?;
    if let Some(v) = view {
        hits.retain(|m| shard_of_offset(m.log_offset) == v.shard);
    }
    let mut body = Vec::new();
    let mut last_ts = 0i64;
    let mut last_off = 0u64;
    for m in &hits {
        if let Some(raw) = read_raw(st, m.log_offset).await? {
            body.extend_from_slice(&raw);
            last_ts = last_ts.max(m.store_timestamp_ms);
            last_off = last_off.max(m.log_offset);
        }
    }
    if body.is_empty() {
        return Err(reject(
            QUERY_NOT_FOUND,
            "can not find message, maybe time range not correct",
        ));
    }
    Ok(ok(req)
        .with_field("indexLastUpdateTimestamp", last_ts)
        .with_field("indexLastUpdatePhyoffset", last_off)
        .with_body(body))
}

pub(super) async fn view_message(
    st: &NodeState,
    req: &RemotingCommand,
) -> Result<RemotingCommand, Reject> {
    let offset: i64 = num(req, "offset")?;
    let not_found = || {
        reject(
            SYSTEM_ERROR,
            format!("can not find message by the offset, {offset}"),
        )
    };
    if offset < 0 {
        return Err(not_found());
    }
    match read_raw(st, offset as u64).await? {
        Some(raw) => Ok(ok(req).with_body(raw)),
        None => Err(not_found()),
    }
}
