//! Consumer groups for admin tools and orderly consumers (RocketMQ's
//! `AdminBrokerProcessor` group codes and the queue locks of `RebalanceLockManager`):
//!
//! | code | request | here |
//! |---|---|---|
//! | 200 `UPDATE_AND_CREATE_SUBSCRIPTIONGROUP` | body: `SubscriptionGroupConfig` JSON | stored with RocketMQ's defaults for missing fields, persisted |
//! | 201 `GET_ALL_SUBSCRIPTIONGROUP_CONFIG` | none | `{subscriptionGroupTable, forbiddenTable, dataVersion}` |
//! | 207 `DELETE_SUBSCRIPTIONGROUP` | `groupName`, `cleanOffset` | removed (and its offsets with `cleanOffset=true`) |
//! | 5003 `DELETE_SUBSCRIPTIONGROUP_LIST` (RocketMQ-Rust's) | body `{groupNameList, cleanOffset}` | each removed as 207 |
//! | 208 `GET_CONSUME_STATS` | `consumerGroup`, `topic` | per read queue: broker max, committed offset, last store time |
//! | 41 `LOCK_BATCH_MQ` | body `{consumerGroup, clientId, mqSet}` | `{"lockOKMQSet": [...]}` |
//! | 42 `UNLOCK_BATCH_MQ` | same body | the caller's locks released |
//! | 203 `GET_CONSUMER_CONNECTION_LIST` | `consumerGroup` | each member's connection (address, client id, language, version) and the group's subscriptions from its heartbeats; none online: CONSUMER_NOT_ONLINE |
//! | 204 `GET_PRODUCER_CONNECTION_LIST` | `producerGroup` | each producer connection of the group; none: SYSTEM_ERROR |
//! | 46 `CHECK_CLIENT_CONFIG` | body `{group, subscriptionData}` | TAG: success; any other type (SQL92): refused, filtering by properties is not served |

use super::admin_store::{mq_key, store_time_at};
use super::{NodeState, Reject, clip, field, ok, reject, store_error};
use crate::StoreOps;
use crate::node::groups::{ClientConn, LockedQueue};
use crate::node::remoting::RemotingCommand;
use crate::node::remoting::codes::*;
use crate::node::shard_view::{ShardView, listed};
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
    delete_one_group(st, name, req.field("cleanOffset") == Some("true"))?;
    Ok(ok(req))
}

/// `DELETE_SUBSCRIPTIONGROUP_LIST` (5003, RocketMQ-Rust's batch form of 207, which
/// `rocketmq-admin-cli deleteSubGroup` sends): body `{"groupNameList":[..],
/// "cleanOffset":bool}`.
pub(super) fn delete_group_list(
    st: &NodeState,
    req: &RemotingCommand,
) -> Result<RemotingCommand, Reject> {
    let names = super::admin_store::string_list(req, "groupNameList")?;
    let clean = body_json(req)?
        .get("cleanOffset")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    for name in &names {
        delete_one_group(st, name, clean)?;
    }
    Ok(ok(req))
}

fn delete_one_group(st: &NodeState, name: &str, clean_offset: bool) -> Result<(), Reject> {
    let had = st.groups.remove(name).map_err(store_error)?;
    if clean_offset {
        st.offsets.remove_group(name);
    }
    tracing::info!(
        group = name,
        had,
        clean_offset,
        "subscription group deleted"
    );
    Ok(())
}

pub(super) async fn consume_stats(
    st: &NodeState,
    req: &RemotingCommand,
    view: Option<ShardView>,
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
        // On a shard's port: that shard broker's queues, under its name and ids.
        let (broker, listed) = listed(view, &st.cfg.broker_name, &topic, conf.read_queue_nums);
        for (shown, q) in listed {
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
                mq_key(&broker, &topic, shown)
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

/// Records what a heartbeat says of its connection (for 203 and 204); the consumer
/// groups whose subscriptions on this connection changed since its last heartbeat.
pub(super) fn note_connection(
    st: &NodeState,
    req: &RemotingCommand,
    conn: u64,
    peer: std::net::SocketAddr,
) -> Vec<String> {
    let Ok(v) = serde_json::from_slice::<Value>(&req.body) else {
        return Vec::new();
    };
    let Some(client_id) = v.get("clientID").and_then(Value::as_str) else {
        return Vec::new();
    };
    let name = |d: &Value| {
        d.get("groupName")
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let list = |k: &str| {
        v.get(k)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let consumers = list("consumerDataSet")
        .into_iter()
        .filter_map(|d| Some((name(&d)?, d)))
        .collect();
    let producers = list("producerDataSet").iter().filter_map(name).collect();
    let info = ClientConn {
        client_id: client_id.to_string(),
        addr: peer.to_string(),
        language: req.language.clone(),
        version: req.version,
        consumers,
        producers,
    };
    let Some(before) = st.client_conns.heartbeat(conn, info.clone()) else {
        return Vec::new();
    };
    info.consumers
        .iter()
        .filter(|(g, data)| {
            before
                .consumers
                .get(*g)
                .is_some_and(|old| subscriptions(old) != subscriptions(data))
        })
        .map(|(g, _)| g.clone())
        .collect()
}

/// What a `ConsumerData` subscribes to: (topic, expression type, expression), sorted.
fn subscriptions(data: &Value) -> Vec<(String, String, String)> {
    let text = |s: &Value, k: &str| s.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    let mut subs: Vec<_> = data
        .get("subscriptionDataSet")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|s| {
            (
                text(s, "topic"),
                text(s, "expressionType"),
                text(s, "subString"),
            )
        })
        .collect();
    subs.sort();
    subs
}

fn connection_json(c: &ClientConn) -> Value {
    json!({"clientAddr": c.addr, "clientId": c.client_id, "language": c.language, "version": c.version})
}

pub(super) fn consumer_connections(
    st: &NodeState,
    req: &RemotingCommand,
) -> Result<RemotingCommand, Reject> {
    let group = field(req, "consumerGroup")?;
    let members = st.clients.members(group);
    let conns: Vec<ClientConn> = st
        .client_conns
        .consumers_of(group)
        .into_iter()
        .filter(|c| members.contains(&c.client_id))
        .collect();
    let Some(last) = conns.last() else {
        return Err(reject(
            CONSUMER_NOT_ONLINE,
            format!("the consumer group[{}] not online", clip(group)),
        ));
    };
    let data = &last.consumers[group];
    let mut subs = serde_json::Map::new();
    for s in data
        .get("subscriptionDataSet")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(t) = s.get("topic").and_then(Value::as_str) {
            subs.insert(t.to_string(), s.clone());
        }
    }
    let body = json!({
        "connectionSet": conns.iter().map(connection_json).collect::<Vec<_>>(),
        "consumeType": data.get("consumeType").cloned().unwrap_or(Value::Null),
        "messageModel": data.get("messageModel").cloned().unwrap_or(Value::Null),
        "consumeFromWhere": data.get("consumeFromWhere").cloned().unwrap_or(Value::Null),
        "subscriptionTable": subs,
    });
    Ok(ok(req).with_body(serde_json::to_vec(&body).unwrap_or_default()))
}

pub(super) fn producer_connections(
    st: &NodeState,
    req: &RemotingCommand,
) -> Result<RemotingCommand, Reject> {
    let group = field(req, "producerGroup")?;
    let conns = st.client_conns.producers_of(group);
    if conns.is_empty() {
        return Err(reject(
            SYSTEM_ERROR,
            format!("the producer group[{}] not exist", clip(group)),
        ));
    }
    let body = json!({ "connectionSet": conns.iter().map(connection_json).collect::<Vec<_>>() });
    Ok(ok(req).with_body(serde_json::to_vec(&body).unwrap_or_default()))
}
