//! RocketMQ's `SlaveSynchronize`: a slave node copies its master's topic config
//! (`GET_ALL_TOPIC_CONFIG`, 21) and consumer offsets (`GET_ALL_CONSUMER_OFFSET`, 43)
//! every `slave_sync_interval_ms` (10 s), replacing its own tables, so consumers that
//! move to the slave resume where the master had them. Every node serves both codes
//! (`processor/admin_broker.rs`). Delay offsets (code 45) come with scheduled delivery.
//!
//! A blocking client on its own thread, one connection kept open between rounds (a
//! failed round drops it; the next connects again). The offset table arrives in
//! RocketMQ's fastjson shape, with bare integer keys (`{0:5}`), which the parser here
//! quotes before decoding.

use super::NodeState;
use super::state::TopicConf;
use crate::node::remoting::codes::{GET_ALL_CONSUMER_OFFSET, GET_ALL_TOPIC_CONFIG, SUCCESS};
use crate::node::remoting::{self, RemotingCommand};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

static OPAQUE: AtomicI32 = AtomicI32::new(1);

/// One request and its response over `conn` (connected first if `None`).
fn call(conn: &mut Option<TcpStream>, master: SocketAddr, code: i32) -> Result<Vec<u8>, String> {
    if conn.is_none() {
        let s = TcpStream::connect_timeout(&master, Duration::from_secs(3))
            .map_err(|e| format!("connect {master}: {e}"))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| e.to_string())?;
        *conn = Some(s);
    }
    let s = conn.as_mut().expect("connected above");
    let req = RemotingCommand::request(code, OPAQUE.fetch_add(1, Ordering::Relaxed), Vec::new());
    s.write_all(&req.encode())
        .map_err(|e| format!("write {master}: {e}"))?;
    let mut prefix = [0u8; 4];
    s.read_exact(&mut prefix)
        .map_err(|e| format!("read {master}: {e}"))?;
    let len = remoting::check_length(prefix, 64 << 20).map_err(|e| e.to_string())?;
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload)
        .map_err(|e| format!("read {master}: {e}"))?;
    let resp = remoting::decode_payload(payload.into()).map_err(|e| e.to_string())?;
    if resp.code != SUCCESS {
        return Err(format!(
            "{master} answered code {code} with {}: {}",
            resp.code,
            resp.remark.unwrap_or_default()
        ));
    }
    Ok(resp.body.to_vec())
}

/// Quotes fastjson's bare integer object keys (`{0:5}` -> `{"0":5}`) outside strings.
pub(crate) fn quote_int_keys(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len() + 16);
    let (mut i, mut in_str) = (0, false);
    while i < b.len() {
        let c = b[i];
        if in_str {
            out.push(c as char);
            if c == b'\\' && i + 1 < b.len() {
                out.push(b[i + 1] as char);
                i += 1;
            } else if c == b'"' {
                in_str = false;
            }
            i += 1;
            continue;
        }
        if c == b'"' {
            in_str = true;
        }
        out.push(c as char);
        if c == b'{' || c == b',' {
            let mut j = i + 1;
            while j < b.len() && b[j].is_ascii_whitespace() {
                j += 1;
            }
            let start = j;
            if j < b.len() && b[j] == b'-' {
                j += 1;
            }
            while j < b.len() && b[j].is_ascii_digit() {
                j += 1;
            }
            let mut k = j;
            while k < b.len() && b[k].is_ascii_whitespace() {
                k += 1;
            }
            if j > start && k < b.len() && b[k] == b':' {
                out.push('"');
                out.push_str(&text[start..j]);
                out.push('"');
                i = j;
                continue;
            }
        }
        i += 1;
    }
    out
}

fn parse_topics(body: &[u8]) -> Result<BTreeMap<String, TopicConf>, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("topic config: {e}"))?;
    let t = v
        .get("topicConfigTable")
        .and_then(Value::as_object)
        .ok_or("topic config without topicConfigTable")?;
    Ok(t.iter()
        .map(|(name, c)| {
            let n = |k: &str| c.get(k).and_then(Value::as_i64).unwrap_or(0) as i32;
            let conf = TopicConf {
                read_queue_nums: n("readQueueNums"),
                write_queue_nums: n("writeQueueNums"),
                perm: n("perm"),
            };
            (name.clone(), conf)
        })
        .collect())
}

pub(crate) fn parse_offsets(body: &[u8]) -> Result<BTreeMap<String, BTreeMap<i32, u64>>, String> {
    let text = String::from_utf8_lossy(body);
    let v: Value =
        serde_json::from_str(&quote_int_keys(&text)).map_err(|e| format!("offsets: {e}"))?;
    let t = v
        .get("offsetTable")
        .and_then(Value::as_object)
        .ok_or("consumer offsets without offsetTable")?;
    Ok(t.iter()
        .map(|(key, qs)| {
            let m = qs
                .as_object()
                .into_iter()
                .flatten()
                .filter_map(|(q, o)| Some((q.parse().ok()?, o.as_u64()?)))
                .collect();
            (key.clone(), m)
        })
        .collect())
}

/// One round: both tables copied, or an error naming what failed.
fn sync_once(
    st: &NodeState,
    conn: &mut Option<TcpStream>,
    master: SocketAddr,
) -> Result<(), String> {
    let topics = parse_topics(&call(conn, master, GET_ALL_TOPIC_CONFIG)?)?;
    let offsets = parse_offsets(&call(conn, master, GET_ALL_CONSUMER_OFFSET)?)?;
    let n = (topics.len(), offsets.len());
    st.topics.replace_all(topics).map_err(|e| e.to_string())?;
    st.offsets.replace_all(offsets);
    tracing::debug!(%master, topics = n.0, offsets = n.1, "copied topics and offsets from the master");
    Ok(())
}

/// Copies from `master` now and every `slave_sync_interval_ms`, until shutdown.
pub(crate) fn sync_loop(st: Arc<NodeState>, master: SocketAddr) {
    let every = Duration::from_millis(st.cfg.slave_sync_interval_ms.max(100));
    let mut conn = None;
    let mut next = Instant::now();
    let mut failing = false;
    while !st.shutting.load(Ordering::SeqCst) {
        if Instant::now() >= next {
            match sync_once(&st, &mut conn, master) {
                Ok(()) => failing = false,
                Err(e) => {
                    conn = None;
                    if !failing {
                        tracing::warn!(%master, error = %e, "cannot copy topics and offsets from the master");
                    }
                    failing = true;
                }
            }
            next = Instant::now() + every;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fastjson_int_keys_are_quoted_outside_strings() {
        let text = r#"{"offsetTable":{"T@g":{0:5,1:7},"a{1:2}":{ 12 :3}}}"#;
        let m = parse_offsets(text.as_bytes()).unwrap();
        assert_eq!(m["T@g"][&0], 5);
        assert_eq!(m["T@g"][&1], 7);
        assert_eq!(m["a{1:2}"][&12], 3);
    }
}
