//! Consumer groups for admin tools and orderly consumers (RocketMQ's
//! `AdminBrokerProcessor` group codes and the queue locks of `RebalanceLockManager`):
//!
//! | code | request | here |
//! |---|---|---|
//! | 200 `UPDATE_AND_CREATE_SUBSCRIPTIONGROUP` | body: `SubscriptionGroupConfig` JSON | stored with RocketMQ's defaults for missing fields, persisted |
//! | 201 `GET_ALL_SUBSCRIPTIONGROUP_CONFIG` | none | `{subscriptionGroupTable, forbiddenTable, dataVersion}` |
//! | 207 `DELETE_SUBSCRIPTIONGROUP` | `groupName`, `cleanOffset` | removed (and its offsets with `cleanOffset=true`) |
//! | 208 `GET_CONSUME_STATS` | `consumerGroup`, `topic` | per read queue: broker max, committed offset, last store time |
//! | 41 `LOCK_BATCH_MQ` | body `{consumerGroup, clientId, mqSet}` | `{"lockOKMQSet": [...]}` |
//! | 42 `UNLOCK_BATCH_MQ` | same body | the caller's locks released |
//! | 46 `CHECK_CLIENT_CONFIG` | body `{group, subscriptionData}` | TAG: success; any other type (SQL92): refused, filtering by properties is not served |

use super::admin_store::{mq_key, store_time_at};
use super::{NodeState, Reject, clip, field, ok, reject, store_error};
use crate::StoreOps;
use crate::node::groups::LockedQueue;
use crate::node::remoting::RemotingCommand;
use crate::node::remoting::codes::*;
use serde_json::{Value, json};
use std::fmt::Write;

fn body_json(req: &RemotingCommand) -> Result<Value, Reject> {
    serde_json::from_slice(&req.body)
        .map_err(|e| reject(SYSTEM_ERROR, format!("the body is not JSON: {e}")))
}

pub(super) fn update_group(
    st: &NodeState,
    req: &RemotingCommand,
) -> Result<RemotingCommand, Reject> {
    let v = body_json(req)?;
    let stored = st
        .groups
        .put(&v)
        .map_err(|e| reject(INVALID_PARAMETER, e))?;
    tracing::info!(group = ?stored.get("groupName"), "subscription group created or updated");
    Ok(ok(req))
}

pub(super) fn all_groups(st: &NodeState, req: &RemotingCommand) -> RemotingCommand {
    ok(req).with_body(serde_json::to_vec(&st.groups.wrapper()).unwrap_or_default())
}

pub(super) fn delete_group(
    st: &NodeState,
    req: &RemotingCommand,
) -> Result<RemotingCommand, Reject> {
    let name = field(req, "groupName")?;
    st.groups.remove(name).map_err(store_error)?;
    if req.field("cleanOffset") == Some("true") {
        st.offsets.remove_group(name);
    }
    Ok(ok(req))
}

pub(super) async fn consume_stats(
    st: &NodeState,
    req: &RemotingCommand,
) -> Result<RemotingCommand, Reject> {
    let group = field(req, "consumerGroup")?;
    let topics: Vec<String> = match req.field("topic").filter(|t| !t.is_empty()) {
        Some(t) => vec![t.to_string()],
        None => st
            .offsets
            .snapshot()
            .keys()
            .filter_map(|k| k.rsplit_once('@'))
            .filter(|(_, g)| *g == group)
            .map(|(t, _)| t.to_string())
            .collect(),
    };
    let mut out = String::from("{\"consumeTps\":0.0,\"offsetTable\":{");
    let mut first = true;
    for topic in topics {
        let Some(conf) = st.topics.get(&topic) else {
            continue;
        };
        for q in 0..conf.read_queue_nums.max(0) {
            let (_, max) = st
                .handle
                .queue_offsets(&topic, q)
                .await
                .map_err(store_error)?;
            let committed = st.offsets.get(group, &topic, q).unwrap_or(0);
            let last = if committed > 0 {
                store_time_at(st, &topic, q, committed - 1).await
            } else {
                0
            };
            if !first {
                out.push(',');
            }
            first = false;
            let _ = write!(
                out,
                "{}:{{\"brokerOffset\":{max},\"consumerOffset\":{committed},\"lastTimestamp\":{last},\"pullOffset\":{committed}}}",
                mq_key(&st.cfg.broker_name, &topic, q)
            );
        }
    }
    out.push_str("}}");
    Ok(ok(req).with_body(out.into_bytes()))
}

/// The `mqSet` of a lock request, with its group and client.
fn lock_body(req: &RemotingCommand) -> Result<(String, String, Vec<LockedQueue>), Reject> {
    let v = body_json(req)?;
    let s = |k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| reject(SYSTEM_ERROR, format!("the lock body has no {k}")))
    };
    let (group, client) = (s("consumerGroup")?, s("clientId")?);
    let mut queues = Vec::new();
    for mq in v
        .get("mqSet")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let topic = mq.get("topic").and_then(Value::as_str);
        let broker = mq.get("brokerName").and_then(Value::as_str);
        let qid = mq
            .get("queueId")
            .and_then(Value::as_i64)
            .and_then(|q| i32::try_from(q).ok());
        match (topic, broker, qid) {
            (Some(t), Some(b), Some(q)) => queues.push((t.to_string(), b.to_string(), q)),
            _ => {
                return Err(reject(
                    SYSTEM_ERROR,
                    format!("a bad message queue in mqSet: {}", clip(&mq.to_string())),
                ));
            }
        }
    }
    Ok((group, client, queues))
}

pub(super) fn lock_batch(st: &NodeState, req: &RemotingCommand) -> Result<RemotingCommand, Reject> {
    let (group, client, queues) = lock_body(req)?;
    let granted = st.locks.try_lock(&group, &client, &queues);
    let set: Vec<Value> = granted
        .into_iter()
        .map(|(t, b, q)| json!({"brokerName": b, "queueId": q, "topic": t}))
        .collect();
    let body = json!({ "lockOKMQSet": set });
    Ok(ok(req).with_body(serde_json::to_vec(&body).unwrap_or_default()))
}

pub(super) fn unlock_batch(
    st: &NodeState,
    req: &RemotingCommand,
) -> Result<RemotingCommand, Reject> {
    let (group, client, queues) = lock_body(req)?;
    st.locks.unlock(&group, &client, &queues);
    Ok(ok(req))
}

pub(super) fn check_client_config(
    _st: &NodeState,
    req: &RemotingCommand,
) -> Result<RemotingCommand, Reject> {
    let v = body_json(req)?;
    let kind = v
        .get("subscriptionData")
        .and_then(|s| s.get("expressionType"))
        .and_then(Value::as_str)
        .unwrap_or("TAG");
    if !kind.eq_ignore_ascii_case("TAG") {
        return Err(reject(
            SYSTEM_ERROR,
            format!(
                "The broker does not support consumer to filter message by {}",
                clip(kind)
            ),
        ));
    }
    Ok(ok(req))
}
