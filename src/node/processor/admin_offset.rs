//! `INVOKE_BROKER_TO_RESET_OFFSET` (222): RocketMQ's `AdminBrokerProcessor.resetOffset`
//! and `Broker2Client.resetOffset` (reference §25.2), what `mqadmin resetOffsetByTime`
//! and `rocketmq-admin-cli resetOffsetByTime` send.
//!
//! Header (`ResetOffsetRequestHeader`): `topic`, `group`, `timestamp` (ms; negative =
//! the queue's end), `isForce`, and RocketMQ 5's optional `queueId` (-1 = every queue)
//! and `offset` (with a queue id: that exact offset, which must lie within the queue's
//! [min, max]).
//!
//! For each read queue of the topic (or the one named) the target is the first offset
//! stored at or after `timestamp` (the store's `queue_offset_by_time`, as
//! SEARCH_OFFSET_BY_TIMESTAMP), or the queue's max for a negative timestamp. As in
//! RocketMQ's client-push mode, the target is taken when `isForce`, when it is below
//! the committed offset (a roll-back), or when the group has no committed offset on
//! that queue; otherwise the committed offset stays. An explicit `queueId` + `offset`
//! is always taken.
//!
//! Unlike RocketMQ 4's client-push mode, the broker commits the new offsets itself
//! (RocketMQ 5's server-side mode does too), so a group with no consumer online is
//! reset all the same and starts there; online consumers are sent
//! RESET_CONSUMER_CLIENT_OFFSET (220) with the table, so they drop their in-memory
//! offsets instead of committing them back. The answer is `ResetOffsetBody` with every
//! queue's resulting offset.
//!
//! Refused: on a slave (it copies its master's offsets), an unknown topic
//! (TOPIC_NOT_EXIST), and a group this broker knows nothing of (no config, no
//! committed offset of the topic, no member online: SUBSCRIPTION_GROUP_NOT_EXIST).

use super::{NodeState, Reject, clip, field, num, ok, opt_num, reject, store_error};
use crate::StoreOps;
use crate::node::broker2client::{self, QueueReset};
use crate::node::remoting::RemotingCommand;
use crate::node::remoting::codes::*;
use crate::node::shard_view::{ShardView, listed};

/// What a reset asks for, from its header.
struct ResetArgs<'a> {
    topic: &'a str,
    group: &'a str,
    timestamp: i64,
    force: bool,
    /// RocketMQ 5's single-queue reset, with its exact offset when one was given.
    queue: Option<(i32, Option<u64>)>,
}

fn args(req: &RemotingCommand) -> Result<ResetArgs<'_>, Reject> {
    let queue_id: Option<i32> = opt_num::<i32>(req, "queueId")?.filter(|q| *q >= 0);
    let offset: Option<u64> = opt_num::<i64>(req, "offset")?
        .filter(|o| *o >= 0)
        .map(|o| o as u64);
    Ok(ResetArgs {
        topic: field(req, "topic")?,
        group: field(req, "group")?,
        timestamp: num(req, "timestamp")?,
        force: req
            .field("isForce")
            .is_some_and(|f| f.eq_ignore_ascii_case("true")),
        queue: queue_id.map(|q| (q, offset)),
    })
}

pub(super) async fn reset_offset(
    st: &NodeState,
    req: &RemotingCommand,
    view: Option<ShardView>,
) -> Result<RemotingCommand, Reject> {
    let a = args(req)?;
    if st.broker_id != 0 {
        return Err(reject(
            SYSTEM_ERROR,
            "reset offset: this broker is a slave; reset on its master",
        ));
    }
    let Some(conf) = st.topics.get(a.topic) else {
        return Err(reject(
            TOPIC_NOT_EXIST,
            format!("reset offset: topic[{}] not exist", clip(a.topic)),
        ));
    };
    // The queues as the broker asked lists them (on a shard's port: that shard
    // broker's, under its name and ids), with the node's id of each.
    let (broker, listed) = listed(view, &st.cfg.broker_name, a.topic, conf.read_queue_nums);
    let queues: Vec<(i32, i32)> = match a.queue {
        Some((q, _)) => match listed.iter().find(|(shown, _)| *shown == q) {
            Some(&one) => vec![one],
            None => {
                return Err(reject(
                    INVALID_PARAMETER,
                    format!(
                        "reset offset: queue {q} of topic {} does not exist ({} read queues \
                         on broker {broker})",
                        a.topic,
                        listed.len()
                    ),
                ));
            }
        },
        None => listed,
    };
    let known = st.groups.contains(a.group)
        || !st.clients.members(a.group).is_empty()
        || (0..conf.read_queue_nums.max(0)).any(|q| st.offsets.get(a.group, a.topic, q).is_some());
    if !known {
        return Err(reject(
            SUBSCRIPTION_GROUP_NOT_EXIST,
            format!(
                "reset offset: the consumer group <{}> not exist",
                clip(a.group)
            ),
        ));
    }
    let mut resets = Vec::with_capacity(queues.len());
    for (shown, q) in queues {
        let offset = new_offset(st, &a, q).await?;
        st.offsets.set(a.group, a.topic, q, offset);
        resets.push(QueueReset {
            queue_id: shown,
            offset,
        });
    }
    let told =
        broker2client::reset_consumer_offsets(st, &broker, a.topic, a.group, a.timestamp, &resets);
    tracing::info!(
        topic = a.topic,
        group = a.group,
        timestamp = a.timestamp,
        force = a.force,
        ?resets,
        consumers_told = told,
        "consumer offsets reset"
    );
    let body = broker2client::reset_offset_body(&broker, a.topic, &resets);
    Ok(ok(req).with_body(body))
}

/// The offset queue `q` is reset to (module docs).
async fn new_offset(st: &NodeState, a: &ResetArgs<'_>, q: i32) -> Result<u64, Reject> {
    let (min, max) = st
        .handle
        .queue_offsets(a.topic, q)
        .await
        .map_err(store_error)?;
    if let Some((_, Some(exact))) = a.queue {
        if !(min..=max).contains(&exact) {
            return Err(reject(
                SYSTEM_ERROR,
                format!(
                    "reset offset: offset {exact} of {}:{q} is outside the queue's [{min}, {max}]",
                    a.topic
                ),
            ));
        }
        return Ok(exact);
    }
    let target = if a.timestamp < 0 {
        max
    } else {
        st.handle
            .queue_offset_by_time(a.topic, q, a.timestamp)
            .await
            .map_err(store_error)?
    };
    Ok(match st.offsets.get(a.group, a.topic, q) {
        Some(committed) if !a.force && target >= committed => committed,
        _ => target,
    })
}
