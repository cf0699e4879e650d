//! The name server's answers, RocketMQ's namesrv `DefaultRequestProcessor`:
//! `GET_ROUTEINFO_BY_TOPIC` (105) and `GET_BROKER_CLUSTER_INFO` (106), served on both
//! ports, naming this node as the only broker (id 0, read/write) of its cluster.
//!
//! Route data carries `enableActingMaster` (RocketMQ 5 names it, and
//! rocketmq-client-rust refuses route data without it). A route lookup never creates
//! a topic: with `auto_create_topic` on, an unknown valid topic is answered with the
//! default queue counts and created by its first send.

use super::{NodeState, Reject, clip, field, ok, reject, topic_conf};
use crate::node::remoting::RemotingCommand;
use crate::node::remoting::codes::*;
use serde_json::{Value, json};

fn broker_addrs(st: &NodeState) -> Value {
    // A slave names itself broker id 1 (RocketMQ's convention for the first slave).
    let mut m = serde_json::Map::new();
    m.insert(st.broker_id.to_string(), json!(st.broker_addr.to_string()));
    Value::Object(m)
}

pub(super) fn route(st: &NodeState, req: &RemotingCommand) -> Result<RemotingCommand, Reject> {
    let topic = field(req, "topic")?;
    let c = topic_conf(st, topic, false).map_err(|(_, remark)| {
        reject(
            TOPIC_NOT_EXIST,
            format!(
                "No topic route info in name server for the topic: {} ({remark})",
                clip(topic)
            ),
        )
    })?;
    let body = json!({
        "orderTopicConf": null,
        "queueDatas": [{
            "brokerName": st.cfg.broker_name,
            "readQueueNums": c.read_queue_nums,
            "writeQueueNums": c.write_queue_nums,
            "perm": c.perm,
            "topicSynFlag": 0,
            "topicSysFlag": 0,
        }],
        "brokerDatas": [{
            "cluster": st.cfg.cluster_name,
            "brokerName": st.cfg.broker_name,
            "brokerAddrs": broker_addrs(st),
            // RocketMQ 5 names it; some clients require it.
            "enableActingMaster": false,
        }],
        "filterServerTable": {},
    });
    Ok(ok(req).with_body(serde_json::to_vec(&body).unwrap_or_default()))
}

pub(super) fn cluster_info(st: &NodeState, req: &RemotingCommand) -> RemotingCommand {
    let name = &st.cfg.broker_name;
    let body = json!({
        "brokerAddrTable": { name.clone(): {
            "cluster": st.cfg.cluster_name,
            "brokerName": name,
            "brokerAddrs": broker_addrs(st),
            "enableActingMaster": false,
        }},
        "clusterAddrTable": { st.cfg.cluster_name.clone(): [name] },
    });
    ok(req).with_body(serde_json::to_vec(&body).unwrap_or_default())
}
