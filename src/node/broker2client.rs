//! Requests the broker starts toward its clients: RocketMQ's `Broker2Client` and the
//! consumer-group half of `DefaultConsumerIdsChangeListener`.
//!
//! | code | sent when | header / body |
//! |---|---|---|
//! | 39 `CHECK_TRANSACTION_STATE` | a half message is undecided (`transaction_check.rs`) | built there |
//! | 40 `NOTIFY_CONSUMER_IDS_CHANGED` | a consumer group's member set changed: a heartbeat registered a client (new to the group or through another connection) or changed its subscriptions, a client unregistered, its connection closed, or it went silent for `client_expiry_ms` | `consumerGroup`; no body |
//! | 220 `RESET_CONSUMER_CLIENT_OFFSET` | an admin reset the group's offsets (`INVOKE_BROKER_TO_RESET_OFFSET`, 222) | `topic`, `group`, `timestamp`; body `ResetOffsetBody` (`{"offsetTable":{MessageQueue:offset}}`), or for a client that says it is `CPP` the list form `{"offsetTable":[{topic, brokerName, queueId, offset}]}` (RocketMQ's `ResetOffsetBodyForC`) |
//!
//! Every one is one-way (flag bit 1, a negative opaque no client uses) and goes to each
//! connection through its outbox (`state::Outboxes`), which its front end drains into
//! the connection's writer between responses. An outbox that is full (a client not
//! reading) drops the frame and the drop is logged: the client heartbeats and
//! rebalances every 20-30 s anyway, as RocketMQ's do. A connection that is gone is
//! skipped quietly (its close is itself a member change, told to the rest).
//!
//! A group whose config sets `notifyConsumerIdsChangedEnable` false is not told of
//! member changes (RocketMQ's rule).

use super::NodeState;
use super::remoting::codes::{NOTIFY_CONSUMER_IDS_CHANGED, RESET_CONSUMER_CLIENT_OFFSET};
use super::remoting::{FLAG_ONEWAY, RemotingCommand};
use super::state::Sent;
use bytes::Bytes;
use std::sync::atomic::{AtomicI32, Ordering};

/// Opaques of broker-started requests (negative: never a client's own).
static NEXT_OPAQUE: AtomicI32 = AtomicI32::new(i32::MIN / 2);

/// A one-way request frame from the broker.
pub(super) fn oneway_frame(code: i32, fields: Vec<(String, String)>, body: Bytes) -> Vec<u8> {
    let opaque = NEXT_OPAQUE.fetch_add(1, Ordering::Relaxed);
    let mut req = RemotingCommand::request(code, opaque, fields);
    req.flag |= FLAG_ONEWAY;
    req.body = body;
    req.encode()
}

/// Sends NOTIFY_CONSUMER_IDS_CHANGED to every connection of each of `groups` (module
/// docs); `why` is for the log.
pub(super) fn consumer_ids_changed(st: &NodeState, groups: &[String], why: &str) {
    for group in groups {
        if !st.groups.notify_ids_changed(group) {
            continue;
        }
        let conns = st.clients.connections(group);
        if conns.is_empty() {
            continue;
        }
        let frame = oneway_frame(
            NOTIFY_CONSUMER_IDS_CHANGED,
            vec![("consumerGroup".to_string(), group.clone())],
            Bytes::new(),
        );
        let mut told = 0;
        for conn in &conns {
            match st.outboxes.send(*conn, frame.clone()) {
                Sent::Queued => told += 1,
                Sent::Closed => {}
                Sent::Full => {
                    tracing::warn!(%group, conn, "consumer ids changed: the connection's outbox is full (a client not reading); notice dropped")
                }
            }
        }
        tracing::debug!(%group, why, told, "consumer ids changed: members notified");
    }
}

/// One queue's new offset after a reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct QueueReset {
    pub queue_id: i32,
    pub offset: u64,
}

/// A reset's `ResetOffsetBody` JSON: fastjson's object keys for the map
/// (`{"offsetTable":{{"brokerName":..,"queueId":..,"topic":..}:offset}}`).
pub(super) fn reset_offset_body(broker: &str, topic: &str, resets: &[QueueReset]) -> Vec<u8> {
    let entries: Vec<String> = resets
        .iter()
        .map(|r| {
            format!(
                "{}:{}",
                super::processor::mq_key(broker, topic, r.queue_id),
                r.offset
            )
        })
        .collect();
    format!("{{\"offsetTable\":{{{}}}}}", entries.join(",")).into_bytes()
}

/// `ResetOffsetBodyForC`: the list form C++ clients read.
fn reset_offset_body_for_c(broker: &str, topic: &str, resets: &[QueueReset]) -> Vec<u8> {
    let list: Vec<serde_json::Value> = resets
        .iter()
        .map(|r| {
            serde_json::json!({
                "topic": topic,
                "brokerName": broker,
                "queueId": r.queue_id,
                "offset": r.offset,
            })
        })
        .collect();
    serde_json::to_vec(&serde_json::json!({ "offsetTable": list })).unwrap_or_default()
}

/// Sends RESET_CONSUMER_CLIENT_OFFSET for `topic` to every connection of `group`;
/// how many connections it went to.
pub(super) fn reset_consumer_offsets(
    st: &NodeState,
    broker: &str,
    topic: &str,
    group: &str,
    timestamp: i64,
    resets: &[QueueReset],
) -> usize {
    let fields = vec![
        ("topic".to_string(), topic.to_string()),
        ("group".to_string(), group.to_string()),
        ("timestamp".to_string(), timestamp.to_string()),
    ];
    let mut told = 0;
    for conn in st.clients.connections(group) {
        let for_c = st
            .client_conns
            .language(conn)
            .is_some_and(|l| l.eq_ignore_ascii_case("CPP"));
        let body = if for_c {
            reset_offset_body_for_c(broker, topic, resets)
        } else {
            reset_offset_body(broker, topic, resets)
        };
        let frame = oneway_frame(RESET_CONSUMER_CLIENT_OFFSET, fields.clone(), body.into());
        match st.outboxes.send(conn, frame) {
            Sent::Queued => told += 1,
            Sent::Closed => {}
            Sent::Full => {
                tracing::warn!(%group, %topic, conn, "reset offset: the consumer's outbox is full (a client not reading); it may commit its old offsets back")
            }
        }
    }
    told
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_bodies_in_both_forms() {
        let resets = [
            QueueReset {
                queue_id: 0,
                offset: 5,
            },
            QueueReset {
                queue_id: 1,
                offset: 0,
            },
        ];
        let text = String::from_utf8(reset_offset_body("b", "T", &resets)).unwrap();
        assert_eq!(
            text,
            "{\"offsetTable\":{{\"brokerName\":\"b\",\"queueId\":0,\"topic\":\"T\"}:5,\
             {\"brokerName\":\"b\",\"queueId\":1,\"topic\":\"T\"}:0}}"
        );
        let c: serde_json::Value =
            serde_json::from_slice(&reset_offset_body_for_c("b", "T", &resets)).unwrap();
        assert_eq!(c["offsetTable"][0]["offset"], 5);
        assert_eq!(c["offsetTable"][1]["queueId"], 1);
        assert_eq!(c["offsetTable"][1]["brokerName"], "b");
    }

    #[test]
    fn frames_are_oneway_requests_with_negative_opaques() {
        let f = oneway_frame(
            NOTIFY_CONSUMER_IDS_CHANGED,
            vec![("consumerGroup".into(), "G".into())],
            Bytes::new(),
        );
        let c = crate::node::remoting::decode_payload(bytes::Bytes::from(f[4..].to_vec())).unwrap();
        assert!(c.is_oneway() && !c.is_response());
        assert!(c.opaque < 0);
        assert_eq!(c.field("consumerGroup"), Some("G"));
    }
}
