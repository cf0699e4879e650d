//! RocketMQ's `AdminBrokerProcessor`, the part clients use: `UPDATE_AND_CREATE_TOPIC`
//! (17, persisted in `config/topics.json`), `SEARCH_OFFSET_BY_TIMESTAMP` (29),
//! `GET_MAX_OFFSET` (30), `GET_MIN_OFFSET` (31) and `GET_EARLIEST_MSG_STORETIME` (32).
//!
//! A topic's read and write queue counts must lie within 1..=`MAX_QUEUE_NUMS` (1024).
//!
//! `GET_ALL_TOPIC_CONFIG` (21) and `GET_ALL_CONSUMER_OFFSET` (43) answer with the
//! whole tables in RocketMQ 4.x's shape, for slaves (`slave_sync.rs`) and admin tools;
//! the offset table uses fastjson's bare integer queue keys (`{0:5}`), as RocketMQ's
//! brokers write it.

use super::{
    NodeState, Reject, clip, field, num, ok, opt_num, queue_args, reject, store_error, valid_topic,
};
use crate::StoreOps;
use crate::node::remoting::RemotingCommand;
use crate::node::remoting::codes::*;
use crate::node::state::{PERM_READ, PERM_WRITE, TopicConf};

pub(super) fn create_topic(
    st: &NodeState,
    req: &RemotingCommand,
) -> Result<RemotingCommand, Reject> {
    let topic = field(req, "topic")?;
    if !valid_topic(topic) {
        return Err(reject(
            SYSTEM_ERROR,
            format!("invalid topic name \"{}\"", clip(topic)),
        ));
    }
    let read: i32 = opt_num(req, "readQueueNums")?.unwrap_or(st.cfg.default_queue_nums);
    let write: i32 = opt_num(req, "writeQueueNums")?.unwrap_or(read);
    let perm: i32 = opt_num(req, "perm")?.unwrap_or(PERM_READ | PERM_WRITE);
    let range = 1..=crate::node::config::MAX_QUEUE_NUMS;
    if !range.contains(&read) || !range.contains(&write) {
        return Err(reject(
            SYSTEM_ERROR,
            format!("queue numbers must be within {range:?}"),
        ));
    }
    let conf = TopicConf {
        read_queue_nums: read,
        write_queue_nums: write,
        perm,
    };
    st.topics.put(topic, conf).map_err(store_error)?;
    tracing::info!(topic, read, write, perm, "topic created or updated");
    Ok(ok(req))
}

pub(super) async fn queue_offset(
    st: &NodeState,
    req: &RemotingCommand,
) -> Result<RemotingCommand, Reject> {
    let (topic, q) = queue_args(req)?;
    let (min, max) = st
        .handle
        .queue_offsets(&topic, q)
        .await
        .map_err(store_error)?;
    let v = if req.code == GET_MAX_OFFSET { max } else { min };
    Ok(ok(req).with_field("offset", v))
}

pub(super) async fn search_offset(
    st: &NodeState,
    req: &RemotingCommand,
) -> Result<RemotingCommand, Reject> {
    let (topic, q) = queue_args(req)?;
    let ts: i64 = num(req, "timestamp")?;
    let o = st
        .handle
        .queue_offset_by_time(&topic, q, ts)
        .await
        .map_err(store_error)?;
    Ok(ok(req).with_field("offset", o))
}

pub(super) async fn earliest_time(
    st: &NodeState,
    req: &RemotingCommand,
) -> Result<RemotingCommand, Reject> {
    let (topic, q) = queue_args(req)?;
    let t = st
        .handle
        .earliest_message_time(&topic, q)
        .await
        .map_err(store_error)?;
    Ok(ok(req).with_field("timestamp", t))
}

pub(super) fn all_topic_config(st: &NodeState, req: &RemotingCommand) -> RemotingCommand {
    let table: serde_json::Map<String, serde_json::Value> = st
        .topics
        .snapshot()
        .into_iter()
        .map(|(name, c)| {
            let v = serde_json::json!({
                "topicName": name,
                "readQueueNums": c.read_queue_nums,
                "writeQueueNums": c.write_queue_nums,
                "perm": c.perm,
                "topicFilterType": "SINGLE_TAG",
                "topicSysFlag": 0,
                "order": false,
            });
            (name, v)
        })
        .collect();
    let body = serde_json::json!({
        "topicConfigTable": table,
        "dataVersion": {"counter": 0, "timestamp": crate::now_ms()},
    });
    ok(req).with_body(serde_json::to_vec(&body).unwrap_or_default())
}

pub(super) fn all_consumer_offsets(st: &NodeState, req: &RemotingCommand) -> RemotingCommand {
    let mut out = String::from("{\"offsetTable\":{");
    for (i, (key, qs)) in st.offsets.snapshot().iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&serde_json::Value::String(key.clone()).to_string());
        out.push_str(":{");
        let qs: Vec<String> = qs.iter().map(|(q, o)| format!("{q}:{o}")).collect();
        out.push_str(&qs.join(","));
        out.push('}');
    }
    out.push_str("}}");
    ok(req).with_body(out.into_bytes())
}
