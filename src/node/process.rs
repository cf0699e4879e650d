//! Request processors: one function per request code, each turning a request into a
//! response (or a held pull). Header fields are read by RocketMQ's names; a missing or
//! malformed field gets `SYSTEM_ERROR` with a remark naming it, as RocketMQ's header
//! decoding does.

use super::NodeState;
use super::state::{PERM_READ, PERM_WRITE, TopicConf};
use crate::StoreOps;
use crate::format::msg_id::MessageId;
use crate::format::properties;
use crate::message::{GetStatus, Message, PutResult, PutStatus};
use crate::node::remoting::RemotingCommand;
use crate::node::remoting::codes::*;
use crate::shard::shard_of_offset;
use bytes::Bytes;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// What the connection does with a request.
pub(crate) enum Outcome {
    Reply(RemotingCommand),
    /// A one-way request: nothing goes back.
    NoReply,
    /// A pull that found nothing, held until a message arrives or time runs out.
    Hold(Hold),
}

pub(crate) struct Hold {
    /// Counts this hold in `NodeState::held` while it lives.
    _counted: HeldGuard,
    pub req: RemotingCommand,
    pub pull: PullArgs,
    /// The queue's arrival counter read before the first attempt.
    pub seen: u64,
    pub deadline: Instant,
}

thread_local! {
    /// The shard this thread runs, when it is a shard executor serving connections
    /// (set by the shard front end): requests for its own queues skip the handle.
    static LOCAL_SHARD: std::cell::RefCell<Option<crate::shard::ShardContext>> =
        const { std::cell::RefCell::new(None) };
}

/// Sets (or clears) this thread's shard context.
pub(crate) fn set_local_shard(ctx: Option<crate::shard::ShardContext>) {
    LOCAL_SHARD.with(|c| *c.borrow_mut() = ctx);
}

/// This thread's store, when this thread is the shard owning `(topic, queue_id)`.
fn local_owner(topic: &str, queue_id: i32) -> Option<crate::store::Store> {
    LOCAL_SHARD.with(|c| {
        c.borrow()
            .as_ref()
            .filter(|ctx| ctx.owns(topic, queue_id))
            .map(|ctx| ctx.store.clone())
    })
}

/// Decrements the count of held pulls when a hold ends (answered or dropped).
struct HeldGuard(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl HeldGuard {
    /// Counts one more hold; returns the guard and the count before.
    fn take(held: &std::sync::Arc<std::sync::atomic::AtomicUsize>) -> (HeldGuard, usize) {
        let before = held.fetch_add(1, Ordering::SeqCst);
        (HeldGuard(held.clone()), before)
    }
}

impl Drop for HeldGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A refusal: response code and remark.
type Reject = (i32, String);

fn reject(code: i32, remark: impl Into<String>) -> Reject {
    (code, remark.into())
}

fn field<'a>(req: &'a RemotingCommand, name: &str) -> Result<&'a str, Reject> {
    req.field(name)
        .ok_or_else(|| reject(SYSTEM_ERROR, format!("the custom field <{name}> is null")))
}

fn num<T: std::str::FromStr>(req: &RemotingCommand, name: &str) -> Result<T, Reject> {
    let v = field(req, name)?;
    v.trim().parse().map_err(|_| {
        reject(
            SYSTEM_ERROR,
            format!("the custom field <{name}> is not a number: {v:?}"),
        )
    })
}

fn opt_num<T: std::str::FromStr>(req: &RemotingCommand, name: &str) -> Result<Option<T>, Reject> {
    match req.field(name) {
        None => Ok(None),
        Some(_) => num(req, name).map(Some),
    }
}

/// RocketMQ's topic rule: 1..=127 characters of `[%|a-zA-Z0-9_-]`.
pub(crate) fn valid_topic(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= 127
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'%' | b'|' | b'_' | b'-'))
}

fn ok(req: &RemotingCommand) -> RemotingCommand {
    RemotingCommand::response_to(req, SUCCESS, None)
}

/// Serves one request.
pub(crate) async fn process(
    st: &NodeState,
    req: RemotingCommand,
    conn: u64,
    peer: SocketAddr,
) -> Outcome {
    st.metrics.requests.fetch_add(1, Ordering::Relaxed);
    let oneway = req.is_oneway();
    tracing::trace!(code = req.code, opaque = req.opaque, fields = ?req.ext_fields, body = req.body.len(), "request");
    let r = match req.code {
        SEND_MESSAGE | SEND_MESSAGE_V2 | SEND_BATCH_MESSAGE => send(st, &req, peer).await,
        PULL_MESSAGE | LITE_PULL_MESSAGE => return pull_request(st, req).await,
        QUERY_MESSAGE => query_message(st, &req).await,
        VIEW_MESSAGE_BY_ID => view_message(st, &req).await,
        QUERY_CONSUMER_OFFSET => query_consumer_offset(st, &req).await,
        UPDATE_CONSUMER_OFFSET => update_consumer_offset(st, &req),
        GET_MAX_OFFSET | GET_MIN_OFFSET => queue_offset(st, &req).await,
        SEARCH_OFFSET_BY_TIMESTAMP => search_offset(st, &req).await,
        GET_EARLIEST_MSG_STORETIME => earliest_time(st, &req).await,
        HEART_BEAT => heartbeat(st, &req, conn),
        UNREGISTER_CLIENT => unregister(st, &req),
        CONSUMER_SEND_MSG_BACK => send_back(st, &req).await,
        GET_CONSUMER_LIST_BY_GROUP => consumer_list(st, &req),
        UPDATE_AND_CREATE_TOPIC => create_topic(st, &req),
        GET_ROUTEINFO_BY_TOPIC => route(st, &req),
        GET_BROKER_CLUSTER_INFO => Ok(cluster_info(st, &req)),
        other => Err(reject(
            REQUEST_CODE_NOT_SUPPORTED,
            format!(" request type {other} not supported"),
        )),
    };
    if oneway {
        return Outcome::NoReply;
    }
    Outcome::Reply(
        r.unwrap_or_else(|(code, remark)| RemotingCommand::response_to(&req, code, Some(remark))),
    )
}

// ---------------------------------------------------------------------------------
// topics

/// The topic's settings, creating it on first use when allowed.
fn topic_conf(st: &NodeState, topic: &str, create: bool) -> Result<TopicConf, Reject> {
    if !valid_topic(topic) {
        return Err(reject(
            TOPIC_NOT_EXIST,
            format!("topic {topic:?} is not a valid topic name ([%|a-zA-Z0-9_-]{{1,127}})"),
        ));
    }
    if let Some(c) = st.topics.get(topic) {
        return Ok(c);
    }
    if !st.cfg.auto_create_topic {
        return Err(reject(
            TOPIC_NOT_EXIST,
            format!("topic[{topic}] not exist, apply first please!"),
        ));
    }
    let conf = TopicConf {
        read_queue_nums: st.cfg.default_queue_nums,
        write_queue_nums: st.cfg.default_queue_nums,
        perm: PERM_READ | PERM_WRITE,
    };
    if create {
        st.topics
            .put(topic, conf)
            .map_err(|e| reject(SYSTEM_ERROR, format!("cannot save topic {topic}: {e}")))?;
        tracing::info!(topic, queues = conf.write_queue_nums, "topic auto-created");
    }
    Ok(conf)
}

fn create_topic(st: &NodeState, req: &RemotingCommand) -> Result<RemotingCommand, Reject> {
    let topic = field(req, "topic")?;
    if !valid_topic(topic) {
        return Err(reject(
            SYSTEM_ERROR,
            format!("invalid topic name {topic:?}"),
        ));
    }
    let read: i32 = opt_num(req, "readQueueNums")?.unwrap_or(st.cfg.default_queue_nums);
    let write: i32 = opt_num(req, "writeQueueNums")?.unwrap_or(read);
    let perm: i32 = opt_num(req, "perm")?.unwrap_or(PERM_READ | PERM_WRITE);
    let range = 1..=super::config::MAX_QUEUE_NUMS;
    if !range.contains(&read) || !range.contains(&write) {
        return Err(reject(
            SYSTEM_ERROR,
            format!("queue numbers must be within {range:?}"),
        ));
    }
    let conf = TopicConf {
        read_queue_nums: read,
        write_queue_nums: write,
        perm,
    };
    st.topics
        .put(topic, conf)
        .map_err(|e| reject(SYSTEM_ERROR, e.to_string()))?;
    tracing::info!(topic, read, write, perm, "topic created or updated");
    Ok(ok(req))
}

fn broker_addrs(st: &NodeState) -> Value {
    json!({ "0": st.broker_addr.to_string() })
}

fn route(st: &NodeState, req: &RemotingCommand) -> Result<RemotingCommand, Reject> {
    let topic = field(req, "topic")?;
    let c = topic_conf(st, topic, false).map_err(|(_, remark)| {
        reject(
            TOPIC_NOT_EXIST,
            format!("No topic route info in name server for the topic: {topic} ({remark})"),
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

fn cluster_info(st: &NodeState, req: &RemotingCommand) -> RemotingCommand {
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

// ---------------------------------------------------------------------------------
// send

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
        PutStatus::CreateMappedFileFailed => (
            SYSTEM_ERROR,
            Some("create mapped file failed, server is busy or broken".into()),
        ),
    }
}

/// Decodes a batch body (RocketMQ's `MessageDecoder.encodeMessages`): per message
/// total size, magic, body CRC, flag (i32 each), body length (i32), body, properties
/// length (i16), properties.
/// One message of a batch body: flag, body, properties.
type BatchItem = (i32, Bytes, Vec<(String, String)>);

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

async fn send(
    st: &NodeState,
    req: &RemotingCommand,
    peer: SocketAddr,
) -> Result<RemotingCommand, Reject> {
    let h = long_names(req);
    let topic = field(&h, "topic")?.to_string();
    if !valid_topic(&topic) {
        return Err(reject(
            MESSAGE_ILLEGAL,
            format!("topic {topic:?} is not a valid topic name ([%|a-zA-Z0-9_-]{{1,127}})"),
        ));
    }
    let conf = topic_conf(st, &topic, true)?;
    if conf.perm & PERM_WRITE == 0 {
        return Err(reject(
            2, // NO_PERMISSION
            format!("the topic[{topic}] sending message is forbidden"),
        ));
    }
    let mut queue_id: i32 = num(&h, "queueId")?;
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
        let msgs: Vec<Message> = decode_batch(&h.body)?
            .into_iter()
            .map(|(f, b, p)| base(f, b, p))
            .collect();
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
        let msg = base(flag, h.body.clone(), props);
        let began = std::time::Instant::now();
        let r = match local_owner(&topic, queue_id) {
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
    st.arrivals.arrived(&topic, queue_id);
    Ok(RemotingCommand::response_to(req, code, remark)
        .with_field("msgId", ids)
        .with_field("queueId", queue_id)
        .with_field("queueOffset", result.queue_offset)
        .with_field("MSG_REGION", "DefaultRegion")
        .with_field("TRACE_ON", "true"))
}

/// Most deliveries before a message goes to the group's dead-letter topic
/// (RocketMQ's `maxReconsumeTimes` default).
const MAX_RECONSUME_TIMES: i32 = 16;

/// `CONSUMER_SEND_MSG_BACK`: a consumer failed a message; store it again in the
/// group's retry topic (`%RETRY%group`), or its dead-letter topic (`%DLQ%group`) once
/// it failed `maxReconsumeTimes` times. Delay levels are not honoured yet (the retry
/// is visible at once): scheduled delivery is not implemented.
async fn send_back(st: &NodeState, req: &RemotingCommand) -> Result<RemotingCommand, Reject> {
    let offset: i64 = num(req, "offset")?;
    let group = field(req, "group")?;
    let max_times: i32 = opt_num(req, "maxReconsumeTimes")?.unwrap_or(MAX_RECONSUME_TIMES);
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
        .map_err(|e| reject(SYSTEM_ERROR, e.to_string()))?
        .ok_or_else(not_found)?;
    let times = m.reconsume_times + 1;
    let topic = if times > max_times {
        format!("%DLQ%{group}")
    } else {
        format!("%RETRY%{group}")
    };
    if !valid_topic(&topic) {
        return Err(reject(
            SYSTEM_ERROR,
            format!("invalid retry topic {topic:?}"),
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

// ---------------------------------------------------------------------------------
// pull

/// `PullMessageRequestHeader`, parsed.
#[derive(Debug, Clone)]
pub(crate) struct PullArgs {
    pub group: String,
    pub topic: String,
    pub queue_id: i32,
    pub offset: u64,
    pub max: usize,
    pub sys_flag: i32,
    pub commit_offset: i64,
    pub suspend_ms: u64,
    /// Tags asked for; empty = every message.
    pub tags: Vec<String>,
}

const PULL_FLAG_COMMIT_OFFSET: i32 = 1;
const PULL_FLAG_SUSPEND: i32 = 2;
/// Most messages one pull returns (RocketMQ caps at 32 by default; clients ask 32).
const PULL_MAX_MESSAGES: usize = 1024;

fn parse_pull(req: &RemotingCommand) -> Result<PullArgs, Reject> {
    let topic = field(req, "topic")?.to_string();
    let offset: i64 = num(req, "queueOffset")?;
    let max: i64 = opt_num(req, "maxMsgNums")?.unwrap_or(32);
    let sub = req.field("subscription").unwrap_or("*").trim();
    let tags = if sub.is_empty() || sub == "*" {
        Vec::new()
    } else {
        sub.split("||")
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty())
            .collect()
    };
    Ok(PullArgs {
        group: req.field("consumerGroup").unwrap_or("").to_string(),
        topic,
        queue_id: num(req, "queueId")?,
        offset: offset.max(0) as u64,
        max: max.clamp(1, PULL_MAX_MESSAGES as i64) as usize,
        sys_flag: opt_num(req, "sysFlag")?.unwrap_or(0),
        commit_offset: opt_num(req, "commitOffset")?.unwrap_or(-1),
        suspend_ms: opt_num::<i64>(req, "suspendTimeoutMillis")?
            .unwrap_or(0)
            .max(0) as u64,
        tags,
    })
}

async fn pull_request(st: &NodeState, req: RemotingCommand) -> Outcome {
    let args = match parse_pull(&req) {
        Ok(a) => a,
        Err((code, remark)) => {
            return Outcome::Reply(RemotingCommand::response_to(&req, code, Some(remark)));
        }
    };
    if args.sys_flag & PULL_FLAG_COMMIT_OFFSET != 0
        && args.commit_offset >= 0
        && !args.group.is_empty()
    {
        st.offsets.set(
            &args.group,
            &args.topic,
            args.queue_id,
            args.commit_offset as u64,
        );
    }
    let seen = st.arrivals.seq(&args.topic, args.queue_id);
    let resp = pull_once(st, &req, &args).await;
    let suspend = args.sys_flag & PULL_FLAG_SUSPEND != 0 && args.suspend_ms > 0;
    if resp.code == PULL_NOT_FOUND
        && suspend
        && st.cfg.long_polling
        && !st.shutting.load(Ordering::SeqCst)
    {
        let (counted, before) = HeldGuard::take(&st.held);
        // Beyond the limit the pull is answered at once (the guard un-counts it).
        if before < st.cfg.max_held_pulls {
            let hold_ms = args.suspend_ms.min(st.cfg.max_suspend_ms);
            return Outcome::Hold(Hold {
                _counted: counted,
                req,
                pull: args,
                seen,
                deadline: Instant::now() + Duration::from_millis(hold_ms),
            });
        }
    }
    Outcome::Reply(resp)
}

/// Whether a record's `TAGS` is among `tags`.
fn tag_matches(raw: &Bytes, tags: &[String]) -> bool {
    match crate::message::StoredMessage::decode(raw) {
        Ok(m) => m
            .property(properties::TAGS)
            .is_some_and(|t| tags.iter().any(|x| x == t)),
        Err(_) => false,
    }
}

/// One attempt at a pull, mapped to RocketMQ's response as `PullMessageProcessor`.
pub(crate) async fn pull_once(
    st: &NodeState,
    req: &RemotingCommand,
    a: &PullArgs,
) -> RemotingCommand {
    let conf = match topic_conf(st, &a.topic, false) {
        Ok(c) => c,
        Err((code, remark)) => return RemotingCommand::response_to(req, code, Some(remark)),
    };
    if a.queue_id < 0 || a.queue_id >= conf.read_queue_nums.max(conf.write_queue_nums) {
        return RemotingCommand::response_to(
            req,
            SYSTEM_ERROR,
            Some(format!(
                "queueId[{}] is illegal, topic:[{}] topicConfig.readQueueNums:[{}]",
                a.queue_id, a.topic, conf.read_queue_nums
            )),
        );
    }
    let max_bytes = st.cfg.pull_max_bytes;
    let got = match local_owner(&a.topic, a.queue_id) {
        Some(store) => {
            store
                .get(&a.topic, a.queue_id, a.offset, a.max, max_bytes)
                .await
        }
        None => {
            st.handle
                .get(&a.topic, a.queue_id, a.offset, a.max, max_bytes)
                .await
        }
    };
    let g = match got {
        Ok(g) => g,
        Err(e) => {
            return RemotingCommand::response_to(req, SYSTEM_ERROR, Some(e.to_string()));
        }
    };
    let records: Vec<Bytes> = if a.tags.is_empty() {
        g.records
    } else {
        g.records
            .into_iter()
            .filter(|r| tag_matches(r, &a.tags))
            .collect()
    };
    let (code, remark) = match g.status {
        GetStatus::Found if records.is_empty() => (PULL_RETRY_IMMEDIATELY, "no matched message"),
        GetStatus::Found => (SUCCESS, ""),
        GetStatus::MessageWasRemoving | GetStatus::NoMatchedMessage => {
            (PULL_RETRY_IMMEDIATELY, "retry immediately")
        }
        GetStatus::NoMatchedLogicQueue | GetStatus::NoMessageInQueue if a.offset != 0 => {
            (PULL_OFFSET_MOVED, "the queue is empty; the offset moved")
        }
        GetStatus::NoMatchedLogicQueue | GetStatus::NoMessageInQueue => {
            (PULL_NOT_FOUND, "no message in the queue")
        }
        GetStatus::OffsetFoundNull | GetStatus::OffsetOverflowOne => {
            (PULL_NOT_FOUND, "no new message")
        }
        GetStatus::OffsetOverflowBadly | GetStatus::OffsetTooSmall => {
            (PULL_OFFSET_MOVED, "the offset is out of the queue's range")
        }
    };
    let mut resp =
        RemotingCommand::response_to(req, code, (!remark.is_empty()).then(|| remark.to_string()))
            .with_field("suggestWhichBrokerId", 0)
            .with_field("nextBeginOffset", g.next_begin_offset)
            .with_field("minOffset", g.min_offset)
            .with_field("maxOffset", g.max_offset);
    if code == SUCCESS {
        let shard = st.handle.shard_of(&a.topic, a.queue_id);
        let total: usize = records.iter().map(Bytes::len).sum();
        let mut body = Vec::with_capacity(total);
        for r in &records {
            body.extend_from_slice(r);
        }
        st.metrics.gets[shard].fetch_add(records.len() as u64, Ordering::Relaxed);
        st.metrics.get_bytes[shard].fetch_add(total as u64, Ordering::Relaxed);
        resp.body = body.into();
    }
    resp
}

/// How a held pull waits: blocking its own thread, or as a task on a glommio executor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waiting {
    Blocking,
    Glommio,
}

/// Waits up to `d` for a signal on `rx`; whether one came.
async fn wait_signal(rx: &flume::Receiver<()>, d: Duration, how: Waiting) -> bool {
    match how {
        Waiting::Blocking => rx.recv_timeout(d).is_ok(),
        Waiting::Glommio => {
            futures_lite::future::or(async { rx.recv_async().await.is_ok() }, async {
                glommio::timer::sleep(d).await;
                false
            })
            .await
        }
    }
}

/// Waits until the shard owning the pulled queue has dispatched what it stored.
async fn wait_dispatched(st: &NodeState, a: &PullArgs) {
    if let Some(store) = local_owner(&a.topic, a.queue_id) {
        return store.wait_dispatched().await;
    }
    let shard = st.handle.shard_of(&a.topic, a.queue_id);
    let _ = st
        .handle
        .run_on(
            shard,
            |ctx| async move { ctx.store.wait_dispatched().await },
        )
        .await;
}

/// Serves a held pull: waits for an arrival in its queue (or the deadline), then
/// answers with whatever a pull finds then.
pub(crate) async fn serve_hold(st: &NodeState, hold: Hold, how: Waiting) -> RemotingCommand {
    let a = &hold.pull;
    let mut seen = hold.seen;
    // A message put just before this pull may not have been dispatched yet.
    wait_dispatched(st, a).await;
    let resp = pull_once(st, &hold.req, a).await;
    if resp.code != PULL_NOT_FOUND {
        return resp;
    }
    loop {
        let left = hold.deadline.saturating_duration_since(Instant::now());
        let rx = st.arrivals.subscribe(&a.topic, a.queue_id, seen);
        // Look again at least every second (RocketMQ's hold service also checks
        // every few seconds besides the arrival notices).
        let moved = wait_signal(&rx, left.min(Duration::from_secs(1)), how).await;
        let done = st.shutting.load(Ordering::SeqCst) || Instant::now() >= hold.deadline;
        if moved {
            seen = st.arrivals.seq(&a.topic, a.queue_id);
            // A put returns before dispatch makes the record visible to pulls.
            wait_dispatched(st, a).await;
        }
        let resp = pull_once(st, &hold.req, a).await;
        if resp.code != PULL_NOT_FOUND || done {
            return resp;
        }
    }
}

// ---------------------------------------------------------------------------------
// queries

async fn read_raw(st: &NodeState, offset: u64) -> Result<Option<Bytes>, Reject> {
    let shard = shard_of_offset(offset);
    if shard >= st.handle.shards() {
        return Ok(None);
    }
    st.handle
        .run_on(shard, move |ctx| async move {
            ctx.store.read_record(offset).await
        })
        .await
        .and_then(|r| r)
        .map_err(|e| reject(SYSTEM_ERROR, e.to_string()))
}

async fn query_message(st: &NodeState, req: &RemotingCommand) -> Result<RemotingCommand, Reject> {
    let topic = field(req, "topic")?;
    let key = field(req, "key")?;
    let max: i64 = opt_num(req, "maxNum")?.unwrap_or(32);
    let begin: i64 = opt_num(req, "beginTimestamp")?.unwrap_or(0);
    let end: i64 = opt_num(req, "endTimestamp")?.unwrap_or(i64::MAX);
    let hits = st
        .handle
        .query_by_key(topic, key, max.max(0) as usize, begin, end)
        .await
        .map_err(|e| reject(SYSTEM_ERROR, e.to_string()))?;
    let mut body = Vec::new();
    let mut last_ts = 0i64;
    let mut last_off = 0u64;
    for m in &hits {
        if let Some(raw) = read_raw(st, m.log_offset).await? {
            body.extend_from_slice(&raw);
            last_ts = last_ts.max(m.store_timestamp_ms);
            last_off = last_off.max(m.log_offset);
        }
    }
    if body.is_empty() {
        return Err(reject(
            QUERY_NOT_FOUND,
            "can not find message, maybe time range not correct",
        ));
    }
    Ok(ok(req)
        .with_field("indexLastUpdateTimestamp", last_ts)
        .with_field("indexLastUpdatePhyoffset", last_off)
        .with_body(body))
}

async fn view_message(st: &NodeState, req: &RemotingCommand) -> Result<RemotingCommand, Reject> {
    let offset: i64 = num(req, "offset")?;
    let not_found = || {
        reject(
            SYSTEM_ERROR,
            format!("can not find message by the offset, {offset}"),
        )
    };
    if offset < 0 {
        return Err(not_found());
    }
    match read_raw(st, offset as u64).await? {
        Some(raw) => Ok(ok(req).with_body(raw)),
        None => Err(not_found()),
    }
}

fn queue_args(req: &RemotingCommand) -> Result<(String, i32), Reject> {
    Ok((field(req, "topic")?.to_string(), num(req, "queueId")?))
}

async fn queue_offset(st: &NodeState, req: &RemotingCommand) -> Result<RemotingCommand, Reject> {
    let (topic, q) = queue_args(req)?;
    let (min, max) = st
        .handle
        .queue_offsets(&topic, q)
        .await
        .map_err(|e| reject(SYSTEM_ERROR, e.to_string()))?;
    let v = if req.code == GET_MAX_OFFSET { max } else { min };
    Ok(ok(req).with_field("offset", v))
}

async fn search_offset(st: &NodeState, req: &RemotingCommand) -> Result<RemotingCommand, Reject> {
    let (topic, q) = queue_args(req)?;
    let ts: i64 = num(req, "timestamp")?;
    let o = st
        .handle
        .queue_offset_by_time(&topic, q, ts)
        .await
        .map_err(|e| reject(SYSTEM_ERROR, e.to_string()))?;
    Ok(ok(req).with_field("offset", o))
}

async fn earliest_time(st: &NodeState, req: &RemotingCommand) -> Result<RemotingCommand, Reject> {
    let (topic, q) = queue_args(req)?;
    let t = st
        .handle
        .earliest_message_time(&topic, q)
        .await
        .map_err(|e| reject(SYSTEM_ERROR, e.to_string()))?;
    Ok(ok(req).with_field("timestamp", t))
}

// ---------------------------------------------------------------------------------
// consumers

async fn query_consumer_offset(
    st: &NodeState,
    req: &RemotingCommand,
) -> Result<RemotingCommand, Reject> {
    let group = field(req, "consumerGroup")?;
    let (topic, q) = queue_args(req)?;
    if let Some(o) = st.offsets.get(group, &topic, q) {
        return Ok(ok(req).with_field("offset", o));
    }
    // RocketMQ: a group with no offset on a queue that still starts at 0 begins at 0.
    let (min, _) = st
        .handle
        .queue_offsets(&topic, q)
        .await
        .map_err(|e| reject(SYSTEM_ERROR, e.to_string()))?;
    if min == 0 {
        return Ok(ok(req).with_field("offset", 0));
    }
    Err(reject(
        QUERY_NOT_FOUND,
        "Not found, maybe this group consumer boot first",
    ))
}

fn update_consumer_offset(
    st: &NodeState,
    req: &RemotingCommand,
) -> Result<RemotingCommand, Reject> {
    let group = field(req, "consumerGroup")?;
    let (topic, q) = queue_args(req)?;
    let o: i64 = num(req, "commitOffset")?;
    if o < 0 {
        return Err(reject(SYSTEM_ERROR, format!("negative commitOffset {o}")));
    }
    st.offsets.set(group, &topic, q, o as u64);
    Ok(ok(req))
}

fn heartbeat(st: &NodeState, req: &RemotingCommand, conn: u64) -> Result<RemotingCommand, Reject> {
    let v: Value = serde_json::from_slice(&req.body)
        .map_err(|e| reject(SYSTEM_ERROR, format!("bad heartbeat body: {e}")))?;
    let client = v
        .get("clientID")
        .and_then(Value::as_str)
        .ok_or_else(|| reject(SYSTEM_ERROR, "heartbeat without clientID"))?;
    let groups: Vec<String> = v
        .get("consumerDataSet")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("groupName").and_then(Value::as_str))
        .map(str::to_string)
        .collect();
    st.clients.heartbeat(conn, client, &groups);
    Ok(ok(req))
}

fn unregister(st: &NodeState, req: &RemotingCommand) -> Result<RemotingCommand, Reject> {
    let client = field(req, "clientID")?;
    if let Some(g) = req.field("consumerGroup") {
        st.clients.unregister(client, g);
    }
    Ok(ok(req))
}

fn consumer_list(st: &NodeState, req: &RemotingCommand) -> Result<RemotingCommand, Reject> {
    let group = field(req, "consumerGroup")?;
    let ids = st.clients.members(group);
    if ids.is_empty() {
        return Err(reject(
            SYSTEM_ERROR,
            format!("no consumer for this group, {group}"),
        ));
    }
    let body = json!({ "consumerIdList": ids });
    Ok(ok(req).with_body(serde_json::to_vec(&body).unwrap_or_default()))
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
