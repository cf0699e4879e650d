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
//! * A single send whose queue another shard owns, on a connection served by a shard,
//!   is put and answered by the owning shard on the connection (`node::shared_out`,
//!   `NodeConfig::owner_answers_routed_sends`); the connection's shard does not wait.
//! * A transactional send (sysFlag prepared or `TRAN_MSG` true) stores a half message
//!   (`crate::transaction::half`), answered with its half-queue offset; refused with
//!   NO_PERMISSION under `reject_transaction_message`, and in a batch.
//! * Sent back: `%RETRY%group` after a delay level's wait (`3 + reconsumeTimes`, or the
//!   level the consumer asks for), `%DLQ%group` once the message failed
//!   `maxReconsumeTimes` (16) times (see [`send_back`]).

use super::reply::{Reply, ReplyTo, SendReply};
use super::{
    NodeState, Reject, clip, field, local_owner, local_store_of, need, num, num_of, opt_num,
    opt_num_of, pool, reject, store_error, topic_conf, valid_topic,
};
use crate::StoreOps;
use crate::format::msg_id::MessageIds;
use crate::format::properties;
use crate::format::record;
use crate::message::{IllegalReason, Message, PutResult, PutStatus};
use crate::node::remoting::RemotingCommand;
use crate::node::remoting::codes::*;
use crate::node::remoting::headers::{SendField, SendHeader};
use crate::node::shard_view::ShardView;
use crate::node::state::PERM_WRITE;
use crate::shard::shard_of_offset;
use bytes::Bytes;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;

/// Maps a store status to RocketMQ's response code and remark.
fn put_code(status: PutStatus) -> (i32, Option<String>) {
    match status {
        PutStatus::PutOk => (SUCCESS, None),
        PutStatus::FlushDiskTimeout => (FLUSH_DISK_TIMEOUT, Some("flush disk timeout".into())),
        PutStatus::MessageIllegal(IllegalReason::TimerDisabled) => (
            MESSAGE_ILLEGAL,
            Some(
                "timed messages (TIMER_DELIVER_MS, TIMER_DELAY_SEC, TIMER_DELAY_MS, \
                 __STARTDELIVERTIME in the future) are switched off on this broker \
                 (timer_enable = false); nothing was stored"
                    .into(),
            ),
        ),
        PutStatus::MessageIllegal(IllegalReason::TimerTooFar) => (
            MESSAGE_ILLEGAL,
            Some(
                "the timed message's delivery time is further ahead than this broker's \
                 timer_max_delay_sec; nothing was stored"
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

/// Decodes a batch body (RocketMQ's `MessageDecoder.encodeMessages`): per message
/// total size, magic, body CRC, flag (i32 each), body length (i32), body, properties
/// length (i16), properties. Calls `each(flag, body, properties)` per message, in
/// order; returns how many.
fn decode_batch(body: &Bytes, mut each: impl FnMut(i32, Bytes, &str)) -> Result<usize, Reject> {
    let bad = |why: &str| reject(MESSAGE_ILLEGAL, format!("bad batch body: {why}"));
    let mut n = 0;
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
        each(flag, body.slice(bstart..bend), props);
        n += 1;
        at = end;
    }
    if n == 0 {
        return Err(bad("no messages"));
    }
    Ok(n)
}

/// The fields every message of one send request shares.
struct SendBase<'a> {
    topic: &'a str,
    queue_id: i32,
    born: i64,
    peer: SocketAddr,
    sys_flag: i32,
    reconsume: i32,
}

impl SendBase<'_> {
    /// Sets `m` to this request's message with `flag`, `body` and the properties text
    /// `props`, reusing `m`'s strings.
    fn fill(&self, m: &mut Message, flag: i32, body: Bytes, props: &str) {
        pool::set_string(&mut m.topic, self.topic);
        m.queue_id = self.queue_id;
        m.flag = flag;
        m.body = body;
        pool::set_properties(&mut m.properties, props);
        m.born_timestamp_ms = self.born;
        m.born_host = self.peer;
        m.sys_flag = self.sys_flag;
        m.reconsume_times = self.reconsume;
        m.prepared_transaction_offset = 0;
    }
}

/// Puts a batch request's messages (one queue, one `put_batch`): the first result and
/// every stored message's id.
async fn put_batch(
    st: &NodeState,
    base: &SendBase<'_>,
    body: &Bytes,
) -> Result<(PutResult, MessageIds, u64, u64), Reject> {
    let mut batch = pool::PooledBatch::take();
    let msgs = batch.messages();
    let mut k = 0;
    let mut bytes = 0u64;
    decode_batch(body, |flag, b, props| {
        bytes += b.len() as u64;
        if k == msgs.len() {
            msgs.push(pool::PooledMessage::take().into_inner());
        }
        base.fill(&mut msgs[k], flag, b, props);
        k += 1;
    })?;
    msgs.truncate(k);
    if msgs
        .iter()
        .any(|m| is_transactional(m.sys_flag, &m.properties))
    {
        return Err(reject(
            MESSAGE_ILLEGAL,
            "a batch cannot hold transactional (TRAN_MSG) messages; nothing was stored",
        ));
    }
    let n = k as u64;
    let refused = || PutResult::refused(PutStatus::ServiceNotAvailable);
    let local = local_owner(base.topic, base.queue_id);
    if local.is_none() {
        st.metrics.routed_sends.fetch_add(1, Ordering::Relaxed);
    }
    let (first, ids) = match local {
        Some(store) => {
            let mut r = store.put_batch(msgs).await;
            let ids = std::mem::take(&mut r.msg_ids);
            (r, ids)
        }
        None => {
            let rs = st.handle.put_batch(batch.into_inner()).await;
            let ids = rs.iter().flat_map(|r| r.msg_ids.iter().copied()).collect();
            (rs.into_iter().next().unwrap_or_else(refused), ids)
        }
    };
    Ok((first, ids, bytes, n))
}

/// A send (codes 10, 310, 320): the message, or a batch when the request says so,
/// put to its queue.
pub(super) async fn send(
    st: &NodeState,
    code: i32,
    h: &SendHeader<'_>,
    body: &Bytes,
    peer: SocketAddr,
    there: Option<(&There, ReplyTo, bool)>,
    view: Option<ShardView>,
) -> Result<Sent, Reject> {
    let topic = need(h.get(SendField::Topic), "topic")?;
    if !valid_topic(topic) {
        return Err(reject(
            MESSAGE_ILLEGAL,
            format!(
                "topic \"{}\" is not a valid topic name ([%|a-zA-Z0-9_-]{{1,127}})",
                clip(topic)
            ),
        ));
    }
    let conf = topic_conf(st, topic, true)?;
    if conf.perm & PERM_WRITE == 0 {
        return Err(reject(
            NO_PERMISSION,
            format!("the topic[{topic}] sending message is forbidden"),
        ));
    }
    let mut queue_id: i32 = num_of(h.get(SendField::QueueId), "queueId")?;
    // On a shard's own port the id is that shard broker's, among its queues of the
    // topic (`node::shard_view`).
    let mine = view.map(|v| v.topic(topic));
    let writable = mine.map_or(conf.write_queue_nums, |m| m.count(conf.write_queue_nums));
    let on_broker = || {
        view.map(|v| {
            format!(
                " on broker {}",
                ShardView::broker_name(&st.cfg.broker_name, v.shard)
            )
        })
        .unwrap_or_default()
    };
    // A topic may have no write queues (RocketMQ drains a topic so): no queue to pick.
    if writable <= 0 {
        return Err(reject(
            SYSTEM_ERROR,
            format!(
                "request queueId[{queue_id}] is illegal, topic {topic} has 0 write queues{} \
                 (writeQueueNums {}): sending to it is closed",
                on_broker(),
                conf.write_queue_nums
            ),
        ));
    }
    if queue_id < 0 {
        queue_id = (st.next_queue.fetch_add(1, Ordering::Relaxed) % writable as u64) as i32;
    }
    let illegal = || {
        reject(
            SYSTEM_ERROR,
            format!(
                "request queueId[{queue_id}] is illegal, topic {topic} has {writable} write \
                 queues{}",
                on_broker()
            ),
        )
    };
    if queue_id >= writable {
        return Err(illegal());
    }
    if let Some(m) = mine {
        queue_id = m.global(queue_id).ok_or_else(illegal)?;
    }
    let sys_flag: i32 = opt_num_of(h.get(SendField::SysFlag), "sysFlag")?.unwrap_or(0);
    let born: i64 =
        opt_num_of(h.get(SendField::BornTimestamp), "bornTimestamp")?.unwrap_or_else(crate::now_ms);
    let flag: i32 = opt_num_of(h.get(SendField::Flag), "flag")?.unwrap_or(0);
    let reconsume: i32 =
        opt_num_of(h.get(SendField::ReconsumeTimes), "reconsumeTimes")?.unwrap_or(0);
    let base = SendBase {
        topic,
        queue_id,
        born,
        peer,
        sys_flag,
        reconsume,
    };
    // On a shard's port the queue is that shard's (`ShardView`'s invariant): no hash.
    let shard = match view {
        Some(v) => v.shard,
        None => st.handle.shard_of(topic, queue_id),
    };
    debug_assert_eq!(shard, st.handle.shard_of(topic, queue_id));
    // The C++ client sends batches as SEND_MESSAGE with `batch = 1`.
    let batch = code == SEND_BATCH_MESSAGE
        || h.get(SendField::Batch)
            .is_some_and(|b| b == "1" || b.eq_ignore_ascii_case("true"));
    // The put's time for `coremq_put_latency_seconds`: its waits only (no clock read
    // for a put answered in its first poll, `crate::stats::timed`).
    let waited_us: u64;
    // The batch and half-message paths are boxed: this future is as large as all its
    // awaited futures together, and the task serving a send is spawned (copied whole)
    // per request (docs/performance/node.md, "The request task's size").
    let (result, ids, bytes, n) = if batch {
        let (r, us) = crate::stats::timed(Box::pin(put_batch(st, &base, body))).await;
        waited_us = us;
        r?
    } else {
        if let Some((there, _, _)) = there {
            there
                .out
                .take_returned(|m| drop(pool::PooledMessage::adopt(m)));
        }
        let mut msg = pool::PooledMessage::take();
        let props = h.get(SendField::Properties).unwrap_or("");
        base.fill(&mut msg, flag, body.clone(), props);
        let mut r = if is_transactional(sys_flag, &msg.properties) {
            refuse_transactional(st)?;
            // A half message waits in the half topic (`crate::transaction`).
            let half = crate::transaction::half(msg.into_inner());
            let (r, us) = crate::stats::timed(Box::pin(async move {
                match local_owner(&half.topic, half.queue_id) {
                    Some(store) => store.put(&half).await,
                    None => st.handle.put(half).await,
                }
            }))
            .await;
            waited_us = us;
            r
        } else {
            let there = there.filter(|(t, _, _)| t.owner_answers);
            let local = local_store_of(shard);
            if local.is_none() {
                st.metrics.routed_sends.fetch_add(1, Ordering::Relaxed);
            }
            match (local, there) {
                (Some(store), _) => {
                    let (r, us) = crate::stats::timed(store.put(&msg)).await;
                    waited_us = us;
                    r
                }
                (None, Some((there, to, oneway))) => {
                    let msg = msg.into_inner();
                    let began = std::time::Instant::now();
                    hand_off(st, there, to, oneway, shard, msg, began).await;
                    return Ok(Sent::Elsewhere);
                }
                (None, None) => {
                    let ((r, back), us) =
                        crate::stats::timed(st.handle.put_and_return(msg.into_inner())).await;
                    waited_us = us;
                    // Back to this thread's pool (freed here if the pool is full).
                    drop(back.map(pool::PooledMessage::adopt));
                    r
                }
            }
        };
        let ids = std::mem::take(&mut r.msg_ids);
        (r, ids, body.len() as u64, 1)
    };
    let stored = Stored {
        shard,
        queue_id,
        batch,
        bytes,
        n,
        took: PutTook::Waited(waited_us),
    };
    let mut reply = stored.answer(st, result, ids)?;
    if let Some(m) = mine {
        reply.queue_id = m.local(reply.queue_id).unwrap_or(reply.queue_id);
    }
    Ok(Sent::Reply(reply))
}

/// What [`send`] did with a send.
pub(super) enum Sent {
    /// Its answer.
    Reply(SendReply),
    /// Handed to the shard owning its queue, which answers the client itself.
    Elsewhere,
}

/// A connection's output, for the shard owning a routed send's queue to answer on
/// (`node::shared_out`).
pub(crate) struct There {
    pub out: std::sync::Arc<crate::node::shared_out::SharedOut>,
    pub st: std::sync::Arc<NodeState>,
    /// The client's address (stored as each message's born host).
    pub peer: SocketAddr,
    /// Routed sends are handed to their owner to answer
    /// (`NodeConfig::owner_answers_routed_sends`).
    pub owner_answers: bool,
    /// A connection to a shard's own port: its queue ids are that shard's
    /// (`node::shard_view`).
    pub view: Option<ShardView>,
}

/// A stored (or refused) put, as [`send`] answers it.
struct Stored {
    shard: usize,
    queue_id: i32,
    batch: bool,
    bytes: u64,
    n: u64,
    took: PutTook,
}

/// How long a put took, for `coremq_put_latency_seconds`.
enum PutTook {
    /// Its waits, in µs (`crate::stats::timed`: 0 when answered in its first poll),
    /// as the store's own put latency counts (`crate::stats`).
    Waited(u64),
    /// Since it was handed to the shard owning its queue (a routed send: the hop
    /// counts).
    Since(std::time::Instant),
}

impl PutTook {
    fn duration(&self) -> std::time::Duration {
        match self {
            PutTook::Waited(us) => std::time::Duration::from_micros(*us),
            PutTook::Since(at) => at.elapsed(),
        }
    }
}

impl Stored {
    fn answer(
        &self,
        st: &NodeState,
        result: PutResult,
        ids: MessageIds,
    ) -> Result<SendReply, Reject> {
        let Stored {
            shard,
            queue_id,
            batch,
            bytes,
            n,
            ref took,
        } = *self;
        st.metrics.put_took(shard, took.duration());
        let (code, remark) = put_code(result.status);
        if !result.status.is_stored() {
            return Err(reject(code, remark.unwrap_or_default()));
        }
        let m = st.metrics.shard(shard);
        m.puts.fetch_add(n, Ordering::Relaxed);
        m.put_bytes.fetch_add(bytes, Ordering::Relaxed);
        let mut ids = ids;
        if !batch {
            // A single send answers its first id (none: an empty id, as before).
            ids.truncate(1);
        }
        // A half message's queueOffset is its place in the half queue
        // (END_TRANSACTION's tranStateTableOffset), as RocketMQ answers.
        Ok(SendReply {
            code,
            remark,
            ids,
            queue_id,
            queue_offset: result.queue_offset,
        })
    }
}

/// Hands a single send whose queue `shard` owns to that shard, which puts it and
/// answers the client on the connection's [`There`] (`node::shared_out`): the
/// connection's shard neither waits for the result nor wakes for it. Answered in every
/// case: a shard that is gone (or a put that panics) drops the job, and the dropped
/// [`Answering`] refuses the send as a routed put to a gone shard is refused.
async fn hand_off(
    st: &NodeState,
    there: &There,
    to: ReplyTo,
    oneway: bool,
    shard: usize,
    msg: Message,
    began: std::time::Instant,
) {
    let answering = Answering::new(there, to, oneway);
    let job = move |store: crate::store::Store| async move {
        let mut answering = answering;
        let mut r = store.put(&msg).await;
        let ids = std::mem::take(&mut r.msg_ids);
        let stored = Stored {
            shard,
            queue_id: msg.queue_id,
            batch: false,
            bytes: msg.body.len() as u64,
            n: 1,
            took: PutTook::Since(began),
        };
        let reply = stored.answer(&answering.st, r, ids);
        answering.answer(reply);
        answering.out.give_back(msg);
    };
    // Refused here, the job and its `Answering` are dropped: answered as refused.
    let _ = st.handle.spawn_on(shard, job).await;
}

/// A routed send's answer, owed to its connection until given (see [`hand_off`]).
struct Answering {
    out: std::sync::Arc<crate::node::shared_out::SharedOut>,
    st: std::sync::Arc<NodeState>,
    to: ReplyTo,
    oneway: bool,
    answered: bool,
}

impl Answering {
    fn new(there: &There, to: ReplyTo, oneway: bool) -> Answering {
        there.out.remote_started();
        Answering {
            out: there.out.clone(),
            st: there.st.clone(),
            to,
            oneway,
            answered: false,
        }
    }

    fn answer(&mut self, r: Result<SendReply, Reject>) {
        self.answered = true;
        if let super::Outcome::Reply(reply) =
            super::answer(self.oneway, self.to, r.map(Reply::Send))
        {
            self.out.answer(|q| reply.encode_into(self.to, q));
        }
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        if !self.answered {
            let (code, remark) = put_code(PutStatus::ServiceNotAvailable);
            self.answer(Err(reject(code, remark.unwrap_or_default())));
        }
        self.out.remote_done();
    }
}

/// Refuses a half message under `reject_transaction_message`.
fn refuse_transactional(st: &NodeState) -> Result<(), Reject> {
    if st.cfg.reject_transaction_message {
        return Err(reject(
            NO_PERMISSION,
            format!(
                "the broker[{}] sending transaction message is forbidden \
                 (reject_transaction_message); nothing was stored",
                st.cfg.broker_name
            ),
        ));
    }
    Ok(())
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

    /// The batch's messages: flag, body, properties text.
    fn decode_all(body: &Bytes) -> Result<Vec<(i32, Bytes, String)>, Reject> {
        let mut out = Vec::new();
        let n = decode_batch(body, |f, b, p| out.push((f, b, p.to_string())))?;
        assert_eq!(n, out.len());
        Ok(out)
    }

    #[test]
    fn batch_round_trip() {
        let wire = encode_batch(&[(1, b"a", "KEYS\u{1}k\u{2}"), (0, b"", "")]);
        let got = decode_all(&Bytes::from(wire)).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].0, 1);
        assert_eq!(&got[0].1[..], b"a");
        assert_eq!(got[0].2, "KEYS\u{1}k\u{2}");
        assert!(got[1].1.is_empty());
        assert!(decode_all(&Bytes::new()).is_err());
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

    proptest! {
        #[test]
        fn batch_decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode_all(&Bytes::from(bytes));
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
            let _ = decode_all(&Bytes::from(wire));
        }
    }
}
