//! Joining an existing RocketMQ cluster (RocketMQ's
//! `BrokerOuterAPI.registerBrokerAll`): with `namesrv_addr` configured, the node
//! registers itself (`REGISTER_BROKER`, 103) with each of those name servers at start
//! and every `register_interval_ms` (RocketMQ: 30 s), naming its topics, so clients
//! asking those name servers find this node.
//!
//! With shard ports (`shard_listen`) each shard registers as the broker
//! `<broker_name>-<shard>` at its own port, naming its own queue counts
//! (`node::shard_view`), as the node's route does.
//!
//! The body is RocketMQ's `RegisterBrokerBody` as JSON (uncompressed); the header
//! carries `bodyCrc32` (CRC-32 of the body, as RocketMQ's `UtilAll.crc32`: the low 31
//! bits), which name servers check.

use super::NodeState;
use super::shard_view::{ShardView, brokers, queue_counts};
use crate::node::remoting::RemotingCommand;
use crate::node::remoting::codes::REGISTER_BROKER;
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// The `RegisterBrokerBody` JSON for this node's topics (as `view`'s shard broker).
pub(crate) fn register_body(st: &NodeState, version: u64, view: Option<ShardView>) -> Vec<u8> {
    let table: serde_json::Map<String, Value> = st
        .topics
        .snapshot()
        .into_iter()
        .map(|(name, c)| {
            let (read, write) = queue_counts(view, &name, c.read_queue_nums, c.write_queue_nums);
            let v = json!({
                "topicName": name,
                "readQueueNums": read,
                "writeQueueNums": write,
                "perm": c.perm,
                "topicFilterType": "SINGLE_TAG",
                "topicSysFlag": 0,
                "order": false,
                "attributes": {},
            });
            (name, v)
        })
        .collect();
    // Shaped as a RocketMQ 5 broker sends it (`TopicConfigAndMappingSerializeWrapper`,
    // `DataVersion` with `stateVersion`): rocketmq-rust's name server requires every
    // field (scripts/namesrv_register.sh checks it).
    let data_version = json!({"stateVersion": 0, "timestamp": crate::now_ms(), "counter": version});
    let body = json!({
        "topicConfigSerializeWrapper": {
            "topicConfigTable": table,
            "dataVersion": data_version,
            "topicQueueMappingInfoMap": {},
            "topicQueueMappingDetailMap": {},
            "mappingDataVersion": {"stateVersion": 0, "timestamp": 0, "counter": 0},
        },
        "filterServerList": [],
    });
    serde_json::to_vec(&body).unwrap_or_default()
}

/// RocketMQ's `UtilAll.crc32`: CRC-32 with the sign bit cleared.
fn crc31(bytes: &[u8]) -> i32 {
    (crc32fast::hash(bytes) & 0x7FFF_FFFF) as i32
}

/// One registration with one name server over `conn` (connected first if `None`);
/// the response code. The connection is kept: a name server takes a closed broker
/// channel for a broker that went away and drops its routes at once (rocketmq-rust's
/// does). On error it is dropped, and the next round connects again.
fn register_once(
    st: &NodeState,
    namesrv: &str,
    version: u64,
    conn: &mut Option<TcpStream>,
) -> Result<i32, String> {
    let r = register_on(st, namesrv, version, conn);
    if r.is_err() {
        *conn = None;
    }
    r
}

fn register_on(
    st: &NodeState,
    namesrv: &str,
    version: u64,
    conn: &mut Option<TcpStream>,
) -> Result<i32, String> {
    if conn.is_none() {
        let addr = namesrv
            .to_socket_addrs()
            .map_err(|e| format!("{namesrv}: {e}"))?
            .next()
            .ok_or_else(|| format!("{namesrv}: no address"))?;
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(3))
            .map_err(|e| format!("connect {namesrv}: {e}"))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(|e| e.to_string())?;
        *conn = Some(s);
    }
    let s = conn.as_mut().expect("connected above");
    // RocketMQ's default when no HA port is bound: the broker port plus one.
    let ha = st.ha_addr.unwrap_or_else(|| {
        std::net::SocketAddrV4::new(*st.broker_addr.ip(), st.broker_addr.port() + 1)
    });
    let mut code = 0;
    for (name, addr, view) in brokers(st) {
        let body = register_body(st, version, view);
        let f = |k: &str, v: String| (k.to_string(), v);
        let req = RemotingCommand::request(
            REGISTER_BROKER,
            version as i32,
            vec![
                f("brokerAddr", addr.to_string()),
                f("brokerId", st.broker_id.to_string()),
                f("brokerName", name),
                f("clusterName", st.cfg.cluster_name.clone()),
                f("haServerAddr", ha.to_string()),
                f("compressed", "false".into()),
                f("bodyCrc32", crc31(&body).to_string()),
            ],
        )
        .with_body(body);
        s.write_all(&req.encode())
            .map_err(|e| format!("write {namesrv}: {e}"))?;
        let mut prefix = [0u8; 4];
        s.read_exact(&mut prefix)
            .map_err(|e| format!("read {namesrv}: {e}"))?;
        let len =
            crate::node::remoting::check_length(prefix, 16 << 20).map_err(|e| e.to_string())?;
        let mut payload = vec![0u8; len];
        s.read_exact(&mut payload)
            .map_err(|e| format!("read {namesrv}: {e}"))?;
        let resp =
            crate::node::remoting::decode_payload(payload.into()).map_err(|e| e.to_string())?;
        if resp.code != 0 {
            code = resp.code;
        }
    }
    Ok(code)
}

/// Registers with every configured name server now and then periodically, until
/// shutdown.
pub(crate) fn register_loop(st: Arc<NodeState>) {
    let every = Duration::from_millis(st.cfg.register_interval_ms.max(100));
    let mut version = 0u64;
    let mut next = Instant::now();
    let mut conns: Vec<Option<TcpStream>> = st.cfg.namesrv_addr.iter().map(|_| None).collect();
    while !st.shutting.load(Ordering::SeqCst) {
        if Instant::now() >= next {
            version += 1;
            for (ns, conn) in st.cfg.namesrv_addr.iter().zip(conns.iter_mut()) {
                match register_once(&st, ns, version, conn) {
                    Ok(0) => tracing::debug!(namesrv = %ns, "registered with the name server"),
                    Ok(code) => {
                        tracing::warn!(namesrv = %ns, code, "the name server refused the registration")
                    }
                    Err(e) => tracing::warn!(namesrv = %ns, error = %e, "cannot register"),
                }
            }
            next = Instant::now() + every;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
