//! `--follow-route`: the brokers a node's route names for the bench topics, as a
//! RocketMQ client finds them (`GET_ROUTEINFO_BY_TOPIC`, which the broker port
//! answers too; with the node's `shard_listen`, one broker per shard at its own port).

use super::{call, topic_name};
use crate::node::remoting::codes::*;
use serde_json::Value;
use std::net::TcpStream;

/// A broker of the route and the (topic index, queue id) pairs it takes, round the
/// topics, then the queues.
pub(super) struct Broker {
    pub addr: String,
    pub dests: Vec<(u64, i64)>,
}

/// The brokers the node's route names for the bench topics (`--follow-route`).
pub(super) fn route_brokers(admin: &mut TcpStream, topics: u32) -> Result<Vec<Broker>, String> {
    // broker address -> per topic, its write queue count there
    let mut counts: Vec<(String, Vec<i64>)> = Vec::new();
    for t in 0..topics {
        let r = call(
            admin,
            GET_ROUTEINFO_BY_TOPIC,
            vec![("topic".into(), topic_name(t))],
        )?;
        if r.code != SUCCESS {
            return Err(format!("no route for {}: {:?}", topic_name(t), r.remark));
        }
        let route: Value = serde_json::from_slice(&r.body)
            .map_err(|e| format!("route of {}: {e}", topic_name(t)))?;
        let datas = route["brokerDatas"].as_array().cloned().unwrap_or_default();
        for qd in route["queueDatas"].as_array().cloned().unwrap_or_default() {
            let name = qd["brokerName"].as_str().unwrap_or_default();
            let addr = datas
                .iter()
                .find(|b| b["brokerName"].as_str() == Some(name))
                .and_then(|b| b["brokerAddrs"]["0"].as_str())
                .ok_or_else(|| {
                    format!("the route of {} has no master for {name}", topic_name(t))
                })?;
            let n = qd["writeQueueNums"].as_i64().unwrap_or(0);
            let at = match counts.iter().position(|(a, _)| a == addr) {
                Some(at) => at,
                None => {
                    counts.push((addr.to_string(), vec![0; topics as usize]));
                    counts.len() - 1
                }
            };
            counts[at].1[t as usize] = n;
        }
    }
    let brokers: Vec<Broker> = counts
        .into_iter()
        .map(|(addr, per_topic)| {
            let most = per_topic.iter().copied().max().unwrap_or(0);
            let dests = (0..most)
                .flat_map(|q| {
                    per_topic
                        .iter()
                        .enumerate()
                        .filter(move |(_, n)| q < **n)
                        .map(move |(t, _)| (t as u64, q))
                })
                .collect();
            Broker { addr, dests }
        })
        .filter(|b: &Broker| !b.dests.is_empty())
        .collect();
    if brokers.is_empty() {
        return Err("the route names no broker with a write queue".into());
    }
    Ok(brokers)
}
