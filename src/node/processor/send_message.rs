//! RocketMQ's `SendMessageProcessor`: `SEND_MESSAGE` (10), `SEND_MESSAGE_V2` (310, the
//! same header with one-letter names), `SEND_BATCH_MESSAGE` (320) and
//! `CONSUMER_SEND_MSG_BACK` (36, a failed message stored again for redelivery).
//!
//! * A send to a topic not yet known creates it when `auto_create_topic` is on
//!   (RocketMQ's `autoCreateTopicEnable`); a negative `queueId` picks the next write
//!   queue round-robin.
//! * A batch is one `put_batch` on one queue; the C++ client sends batches as code 10
//!   with `batch = 1`, so that flag counts as well as code 320.
//! * A stored put (`PutOk`; `FlushDiskTimeout`, `FlushSlaveTimeout`, `SlaveNotAvailable`:
//!   stored, durability or replication not confirmed, codes 10, 12, 11 as RocketMQ's
//!   `SendMessageProcessor`) is answered with its code, `msgId` and `queueOffset`; any other status is
//!   refused with RocketMQ's response code and a remark. Only a stored put signals the
//!   queue's held pulls.
//! * A transactional send (sysFlag prepared or `TRAN_MSG` true) stores a half message
//!   (`crate::transaction::half`), answered with its half-queue offset; refused with
//!   NO_PERMISSION under `reject_transaction_message`, and in a batch.
//! * Sent back: `%RETRY%group` after a delay level's wait (`3 + reconsumeTimes`, or the
//!   level the consumer asks for), `%DLQ%group` once the message failed
//!   `maxReconsumeTimes` (16) times (see [`send_back`]).

use super::{
    NodeState, Reject, clip, field, local_owner, num, opt_num, reject, store_error, topic_conf,
    valid_topic,
};
use crate::StoreOps;
use crate::format::msg_id::MessageId;
use crate::format::properties;
use crate::format::record;
use crate::message::{IllegalReason, Message, PutResult, PutStatus};
use crate::node::remoting::RemotingCommand;
use crate::node::remoting::codes::*;
use crate::node::state::PERM_WRITE;
use crate::shard::shard_of_offset;
use bytes::Bytes;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;

/// `SendMessageRequestHeaderV2`'s one-letter names.
const V2_NAMES: [(&str, &str); 14] = [
    ("a", "producerGroup"),
    ("b", "topic"),
    ("c", "defaultTopic"),
    ("d", "defaultTopicQueueNums"),
    ("e", "queueId"),
    ("f", "sysFlag"),
    ("g", "bornTimestamp"),
    ("h", "flag"),
    ("i", "properties"),
    ("j", "reconsumeTimes"),
    ("k", "unitMode"),
    ("l", "maxReconsumeTimes"),
    ("m", "batch"),
    ("n", "brokerName"),
];

/// The request with V2 one-letter header names turned into the long ones.
fn long_names(req: &RemotingCommand) -> RemotingCommand {
    if req.field("topic").is_some() || req.field("b").is_none() {
        return req.clone();
    }
    let mut r = req.clone();
    for (k, _) in r.ext_fields.iter_mut() {
        if let Some((_, long)) = V2_NAMES.iter().find(|(short, _)| short == k) {
            *k = long.to_string();
        }
    }
    r
}

fn parse_properties(s: &str) -> Vec<(String, String)> {
    properties::iter(s.as_bytes())
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

/// Maps a store status to RocketMQ's response code and remark.
fn put_code(status: PutStatus) -> (i32, Option<String>) {
    match status {
        PutStatus::PutOk => (SUCCESS, None),
        PutStatus::FlushDiskTimeout => (FLUSH_DISK_TIMEOUT, Some("flush disk timeout".into())),
        PutStatus::MessageIllegal(IllegalReason::TimerDisabled) => (
            MESSAGE_ILLEGAL,
            Some(
                "timed messages (TIMER_DELIVER_MS, TIMER_DELAY_SEC, TIMER_DELAY_MS, \
                 __STARTDELIVERTIME in the future) are not supported by this broker yet \
                 (timer_enable is off); nothing was stored"
                    .into(),
            ),
        ),
        PutStatus::MessageIllegal(why) => (
            MESSAGE_ILLEGAL,
            Some(format!("the message is illegal: {why:?}")),
        ),
        PutStatus::PropertiesSizeExceeded => (
            MESSAGE_ILLEGAL,
            Some("the message properties are too long (over 32767 bytes)".into()),
        ),
        PutStatus::ServiceNotAvailable => (
            SERVICE_NOT_AVAILABLE,
            Some("service not available now: the store is shutting down or failed".into()),
        ),
        PutStatus::DiskFull => (
            SERVICE_NOT_AVAILABLE,
            Some("service not available now: the broker's disk is full (over disk_full_ratio or under disk_min_free_bytes)".into()),
        ),
        // RocketMQ's answer to OS_PAGE_CACHE_BUSY; its clients retry SYSTEM_BUSY on
        // another broker (nothing was stored).
        PutStatus::OsPageCacheBusy => (
            SYSTEM_BUSY,
            Some("[PC_SYNCHRONIZED]broker busy, start flow control for a while: no room for the message within the put timeout (disk stalled or too slow)".into()),
        ),
        PutStatus::FlushSlaveTimeout => (
            FLUSH_SLAVE_TIMEOUT,
            Some("wait for the slave's acknowledgement timed out; the message is stored on the master".into()),
        ),
        PutStatus::SlaveNotAvailable => (
            SLAVE_NOT_AVAILABLE,
            Some("no slave is in sync (none connected, or too far behind); the message is stored on the master".into()),
        ),
        PutStatus::SlaveMode => (
            SERVICE_NOT_AVAILABLE,
            Some("service not available now: this broker is a slave (slave mode) and takes no writes; send to its master".into()),
        ),
        PutStatus::CreateMappedFileFailed => (
            SYSTEM_ERROR,
            Some("create mapped file failed, server is busy or broken".into()),
        ),
    }
}

/// One message of a batch body: flag, body, properties.
type BatchItem = (i32, Bytes, Vec<(String, String)>);

/// Decodes a batch body (RocketMQ's `MessageDecoder.encodeMessages`): per message
/// total size, magic, body CRC, flag (i32 each), body length (i32), body, properties
/// length (i16), properties.
fn decode_batch(body: &Bytes) -> Result<Vec<BatchItem>, Reject> {
    let bad = |why: &str| reject(MESSAGE_ILLEGAL, format!("bad batch body: {why}"));
    let mut out = Vec::new();
    let mut at = 0usize;
    let be32 = |b: &[u8], at: usize| -> Option<i32> {
        Some(i32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
    };
    while at < body.len() {
        let total = be32(body, at).ok_or_else(|| bad("truncated size"))?;
        if total < 22 || total as usize > body.len() - at {
            return Err(bad("message size out of range"));
        }
        let end = at + total as usize;
        let flag = be32(body, at + 12).ok_or_else(|| bad("truncated flag"))?;
        let blen = be32(body, at + 16).ok_or_else(|| bad("truncated body length"))?;
        let bstart = at + 20;
        if blen < 0 || bstart + blen as usize + 2 > end {
            return Err(bad("body length out of range"));
        }
        let bend = bstart + blen as usize;
        let plen = i16::from_be_bytes([body[bend], body[bend + 1]]);
        let pstart = bend + 2;
        if plen < 0 || pstart + plen as usize != end {
            return Err(bad("properties length does not match the message size"));
        }
        let props =
            std::str::from_utf8(&body[pstart..end]).map_err(|_| bad("properties are not UTF-8"))?;
        out.push((flag, body.slice(bstart..bend), parse_properties(props)));
        at = end;
    }
    if out.is_empty() {
        return Err(bad("no messages"));
    }
    Ok(out)
}

pub(super) async fn send(
    st: &NodeState,
    req: &RemotingCommand,
    peer: SocketAddr,
) -> Result<RemotingCommand, Reject> {
    let h = long_names(req);
    let topic = field(&h, "topic")?.to_string();
    if !valid_topic(&topic) {
        return Err(reject(
            MESSAGE_ILLEGAL,
            format!(
                "topic \"{}\" is not a valid topic name ([%|a-zA-Z0-9_-]{{1,127}})",
                clip(&topic)
            ),
        ));
    }
    let conf = topic_conf(st, &topic, true)?;
    if conf.perm & PERM_WRITE == 0 {
        return Err(reject(
            NO_PERMISSION,
            format!("the topic[{topic}] sending message is forbidden"),
        ));
    }
    let mut queue_id: i32 = num(&h, "queueId")?;
    // A topic may have no write queues (RocketMQ drains a topic so): no queue to pick.
    if conf.write_queue_nums <= 0 {
        return Err(reject(
            SYSTEM_ERROR,
            format!(
                "request queueId[{queue_id}] is illegal, topic {topic} has 0 write queues \
                 (writeQueueNums {}): sending to it is closed",
                conf.write_queue_nums
            ),
        ));
    }
    if queue_id < 0 {
        queue_id =
            (st.next_queue.fetch_add(1, Ordering::Relaxed) % conf.write_queue_nums as u64) as i32;
    }
    if queue_id >= conf.write_queue_nums {
        return Err(reject(
            SYSTEM_ERROR,
            format!(
                "request queueId[{queue_id}] is illegal, topic {topic} has {} write queues",
                conf.write_queue_nums
            ),
        ));
    }
    let sys_flag: i32 = opt_num(&h, "sysFlag")?.unwrap_or(0);
    let born: i64 = opt_num(&h, "bornTimestamp")?.unwrap_or_else(crate::now_ms);
    let flag: i32 = opt_num(&h, "flag")?.unwrap_or(0);
    let reconsume: i32 = opt_num(&h, "reconsumeTimes")?.unwrap_or(0);
    let props = parse_properties(h.field("properties").unwrap_or(""));
    let transactional = is_transactional(sys_flag, &props);
    if transactional && st.cfg.reject_transaction_message {
        return Err(reject(
            NO_PERMISSION,
            format!(
                "the broker[{}] sending transaction message is forbidden \
                 (reject_transaction_message); nothing was stored",
                st.cfg.broker_name
            ),
        ));
    }
    let base = |flag: i32, body: Bytes, properties: Vec<(String, String)>| Message {
        topic: topic.clone(),
        queue_id,
        flag,
        body,
        properties,
        born_timestamp_ms: born,
        born_host: peer,
        sys_flag,
        reconsume_times: reconsume,
        prepared_transaction_offset: 0,
    };
    let shard = st.handle.shard_of(&topic, queue_id);
    // The C++ client sends batches as SEND_MESSAGE with `batch = 1`.
    let batch = req.code == SEND_BATCH_MESSAGE
        || h.field("batch")
            .is_some_and(|b| b == "1" || b.eq_ignore_ascii_case("true"));
    let (result, ids, bytes, n) = if batch {
        let items = decode_batch(&h.body)?;
        if transactional || items.iter().any(|(_, _, p)| is_transactional(0, p)) {
            return Err(reject(
                MESSAGE_ILLEGAL,
                "a batch cannot hold transactional (TRAN_MSG) messages; nothing was stored",
            ));
        }
        let msgs: Vec<Message> = items.into_iter().map(|(f, b, p)| base(f, b, p)).collect();
        let n = msgs.len() as u64;
        let bytes: u64 = msgs.iter().map(|m| m.body.len() as u64).sum();
        let began = std::time::Instant::now();
        let rs = match local_owner(&topic, queue_id) {
            Some(store) => vec![store.put_batch(&msgs).await],
            None => st.handle.put_batch(msgs).await,
        };
        st.metrics.put_took(shard, began.elapsed());
        let ids: Vec<String> = rs
            .iter()
            .flat_map(|r| r.msg_ids.iter().map(MessageId::to_string))
            .collect();
        let first = rs.into_iter().next().unwrap_or_else(|| PutResult {
            status: PutStatus::ServiceNotAvailable,
            log_offset: 0,
            wrote_bytes: 0,
            queue_offset: 0,
            msg_ids: Vec::new(),
            store_timestamp_ms: 0,
        });
        (first, ids.join(","), bytes, n)
    } else {
        let bytes = h.body.len() as u64;
        let mut msg = base(flag, h.body.clone(), props);
        if transactional {
            // A half message waits in the half topic (`crate::transaction`).
            msg = crate::transaction::half(msg);
        }
        let began = std::time::Instant::now();
        let r = match local_owner(&msg.topic, msg.queue_id) {
            Some(store) => store.put(msg).await,
            None => st.handle.put(msg).await,
        };
        st.metrics.put_took(shard, began.elapsed());
        let ids = r.msg_ids.first().map(|i| i.to_string()).unwrap_or_default();
        (r, ids, bytes, 1)
    };
    let (code, remark) = put_code(result.status);
    if !result.status.is_stored() {
        return Err(reject(code, remark.unwrap_or_default()));
    }
    st.metrics.puts[shard].fetch_add(n, Ordering::Relaxed);
    st.metrics.put_bytes[shard].fetch_add(bytes, Ordering::Relaxed);
    if !transactional {
        st.arrivals.arrived(&topic, queue_id);
    }
    // A half message's queueOffset is its place in the half queue
    // (END_TRANSACTION's tranStateTableOffset), as RocketMQ answers.
    Ok(RemotingCommand::response_to(req, code, remark)
        .with_field("msgId", ids)
        .with_field("queueId", queue_id)
        .with_field("queueOffset", result.queue_offset)
        .with_field("MSG_REGION", "DefaultRegion")
        .with_field("TRACE_ON", "true"))
}

/// A half message of a transaction: the prepared type in `sysFlag` or `TRAN_MSG`
/// true (RocketMQ's `SendMessageProcessor` looks at the property).
fn is_transactional(sys_flag: i32, props: &[(String, String)]) -> bool {
    sys_flag & record::SYSFLAG_TRANSACTION_MASK == record::SYSFLAG_TRANSACTION_PREPARED
        || props
            .iter()
            .any(|(n, v)| n == properties::TRAN_MSG && v.trim().eq_ignore_ascii_case("true"))
}

/// Most deliveries before a message goes to the group's dead-letter topic
/// (RocketMQ's `maxReconsumeTimes` default).
const MAX_RECONSUME_TIMES: i32 = 16;

/// `CONSUMER_SEND_MSG_BACK`: a consumer failed a message; store it again for a later
/// try, as RocketMQ's `consumerSendMsgBack` does: into the group's retry topic
/// (`%RETRY%group`, queue 0) with delay level `delayLevel` when the consumer names one,
/// else `3 + reconsumeTimes` (10 s, 30 s, 1 min, ... 2 h; the store clamps it to its
/// last level), so it comes back after that delay (`crate::schedule`); into the
/// dead-letter topic (`%DLQ%group`, queue 0, at once) once it failed
/// `maxReconsumeTimes` (16) times or when `delayLevel` is negative. The new record's
/// reconsume count is the original's plus one; `RETRY_TOPIC` names the first topic,
/// `ORIGIN_MESSAGE_ID` the first message id.
pub(super) async fn send_back(
    st: &NodeState,
    req: &RemotingCommand,
) -> Result<RemotingCommand, Reject> {
    let offset: i64 = num(req, "offset")?;
    let group = field(req, "group")?;
    let max_times: i32 = opt_num(req, "maxReconsumeTimes")?.unwrap_or(MAX_RECONSUME_TIMES);
    let delay_level: i32 = opt_num(req, "delayLevel")?.unwrap_or(0);
    let not_found = || {
        reject(
            SYSTEM_ERROR,
            format!("look message by offset failed, {offset}"),
        )
    };
    if offset < 0 {
        return Err(not_found());
    }
    let shard = shard_of_offset(offset as u64);
    if shard >= st.handle.shards() {
        return Err(not_found());
    }
    let m = st
        .handle
        .look_by_offset(offset as u64)
        .await
        .map_err(store_error)?
        .ok_or_else(not_found)?;
    // Saturating: a stored message may carry any reconsume count (a client sets it).
    let times = m.reconsume_times.saturating_add(1);
    let dead = m.reconsume_times >= max_times || delay_level < 0;
    let topic = if dead {
        format!("%DLQ%{group}")
    } else {
        format!("%RETRY%{group}")
    };
    if !valid_topic(&topic) {
        return Err(reject(
            SYSTEM_ERROR,
            format!("invalid retry topic \"{}\"", clip(&topic)),
        ));
    }
    topic_conf(st, &topic, true)?;
    let mut props = m.properties.clone();
    let mut set = |name: &str, value: String, overwrite: bool| match props
        .iter_mut()
        .find(|(n, _)| n == name)
    {
        Some((_, v)) if overwrite => *v = value,
        Some(_) => {}
        None => props.push((name.to_string(), value)),
    };
    set("RETRY_TOPIC", m.topic.clone(), false);
    let origin = req
        .field("originMsgId")
        .map(str::to_string)
        .or_else(|| m.msg_id.map(|i| i.to_string()))
        .unwrap_or_default();
    set("ORIGIN_MESSAGE_ID", origin, false);
    // The retry's delay; a dead letter is stored at once (RocketMQ sets `DELAY` 0).
    let level = if dead {
        0
    } else if delay_level > 0 {
        delay_level
    } else {
        times.saturating_add(2)
    };
    set(properties::DELAY, level.to_string(), true);
    let msg = Message {
        topic: topic.clone(),
        queue_id: 0,
        flag: m.flag,
        body: m.body.clone(),
        properties: props,
        born_timestamp_ms: m.born_timestamp_ms,
        born_host: m.born_host,
        sys_flag: m.sys_flag,
        reconsume_times: times,
        prepared_transaction_offset: 0,
    };
    let r = st.handle.put(msg).await;
    let (code, remark) = put_code(r.status);
    if !r.status.is_stored() {
        return Err(reject(code, remark.unwrap_or_default()));
    }
    st.arrivals.arrived(&topic, 0);
    Ok(RemotingCommand::response_to(req, code, remark))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn encode_batch(msgs: &[(i32, &[u8], &str)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (flag, body, props) in msgs {
            let size = 20 + body.len() + 2 + props.len();
            out.extend_from_slice(&(size as i32).to_be_bytes());
            out.extend_from_slice(&[0; 8]); // magic, body CRC
            out.extend_from_slice(&flag.to_be_bytes());
            out.extend_from_slice(&(body.len() as i32).to_be_bytes());
            out.extend_from_slice(body);
            out.extend_from_slice(&(props.len() as i16).to_be_bytes());
            out.extend_from_slice(props.as_bytes());
        }
        out
    }

    #[test]
    fn batch_round_trip() {
        let wire = encode_batch(&[(1, b"a", "KEYS\u{1}k\u{2}"), (0, b"", "")]);
        let got = decode_batch(&Bytes::from(wire)).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].0, 1);
        assert_eq!(&got[0].1[..], b"a");
        assert_eq!(got[0].2, vec![("KEYS".to_string(), "k".to_string())]);
        assert!(got[1].1.is_empty());
        assert!(decode_batch(&Bytes::new()).is_err());
    }

    /// A put stored with its durability unknown (flush timed out or failed) answers
    /// RocketMQ's FLUSH_DISK_TIMEOUT (10), which clients do not retry; only puts
    /// refused before anything was stored answer SERVICE_NOT_AVAILABLE (14), which
    /// they do retry.
    #[test]
    fn statuses_map_to_rocketmq_codes_clients_retry_only_when_nothing_was_stored() {
        assert_eq!(put_code(PutStatus::FlushDiskTimeout).0, 10);
        assert_eq!(put_code(PutStatus::ServiceNotAvailable).0, 14);
        assert_eq!(put_code(PutStatus::PutOk).0, SUCCESS);
    }

    #[test]
    fn v2_names_become_long_names() {
        let req = RemotingCommand::request(
            SEND_MESSAGE_V2,
            1,
            vec![("b".into(), "T".into()), ("e".into(), "3".into())],
        );
        let long = long_names(&req);
        assert_eq!(long.field("topic"), Some("T"));
        assert_eq!(long.field("queueId"), Some("3"));
    }

    proptest! {
        #[test]
        fn batch_decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode_batch(&Bytes::from(bytes));
        }

        #[test]
        fn batch_decoder_never_panics_on_damaged_batches(
            body in proptest::collection::vec(any::<u8>(), 0..40),
            at in 0usize..80,
            value in any::<u8>(),
        ) {
            let mut wire = encode_batch(&[(0, &body, "KEYS\u{1}x\u{2}"), (0, b"b", "")]);
            let i = at % wire.len();
            wire[i] = value;
            let _ = decode_batch(&Bytes::from(wire));
        }
    }
}
