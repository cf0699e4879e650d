//! The name server's answers, RocketMQ's namesrv `DefaultRequestProcessor`:
//! `GET_ROUTEINFO_BY_TOPIC` (105) and `GET_BROKER_CLUSTER_INFO` (106), served on both
//! ports, naming this node as the only broker (id 0, read/write) of its cluster.
//!
//! With shard ports (`shard_listen`, `node::shard_view`) the node names each shard as
//! a broker of its own, `<broker_name>-<shard>` at its port, holding the queues that
//! shard owns (a shard owning none of a topic's queues is left out of its route).
//!
//! Route data carries `enableActingMaster` (RocketMQ 5 names it, and
//! rocketmq-client-rust refuses route data without it). A route lookup never creates
//! a topic: with `auto_create_topic` on, an unknown valid topic is answered with the
//! default queue counts and created by its first send.

use super::{NodeState, Reject, clip, field, ok, reject, topic_conf};
use crate::node::remoting::RemotingCommand;
use crate::node::remoting::codes::*;
use crate::node::shard_view::{brokers, queue_counts};
use serde_json::{Value, json};

fn broker_addrs(st: &NodeState, addr: std::net::SocketAddrV4) -> Value {
    // A slave names itself broker id 1 (RocketMQ's convention for the first slave).
    let mut m = serde_json::Map::new();
    m.insert(st.broker_id.to_string(), json!(addr.to_string()));
    Value::Object(m)
}

fn broker_data(st: &NodeState, name: &str, addr: std::net::SocketAddrV4) -> Value {
    json!({
        "cluster": st.cfg.cluster_name,
        "brokerName": name,
        "brokerAddrs": broker_addrs(st, addr),
        // RocketMQ 5 names it; some clients require it.
        "enableActingMaster": false,
    })
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
    let (mut queues, mut datas) = (Vec::new(), Vec::new());
    for (name, addr, view) in brokers(st) {
        let (read, write) = queue_counts(view, topic, c.read_queue_nums, c.write_queue_nums);
        if view.is_some() && read == 0 && write == 0 {
            continue;
        }
        queues.push(json!({
            "brokerName": name,
            "readQueueNums": read,
            "writeQueueNums": write,
            "perm": c.perm,
            "topicSynFlag": 0,
            "topicSysFlag": 0,
        }));
        datas.push(broker_data(st, &name, addr));
    }
    let body = json!({
        "orderTopicConf": null,
        "queueDatas": queues,
        "brokerDatas": datas,
        "filterServerTable": {},
    });
    Ok(ok(req).with_body(serde_json::to_vec(&body).unwrap_or_default()))
}

pub(super) fn cluster_info(st: &NodeState, req: &RemotingCommand) -> RemotingCommand {
    let mut table = serde_json::Map::new();
    let mut names = Vec::new();
    for (name, addr, _) in brokers(st) {
        table.insert(name.clone(), broker_data(st, &name, addr));
        names.push(name);
    }
    let body = json!({
        "brokerAddrTable": table,
        "clusterAddrTable": { st.cfg.cluster_name.clone(): names },
    });
    ok(req).with_body(serde_json::to_vec(&body).unwrap_or_default())
}
