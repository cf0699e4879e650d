//! The request processors: RocketMQ's broker `NettyRequestProcessor`s (the table
//! `BrokerController.registerProcessor` fills) plus the name server's answers, one file
//! per RocketMQ processor, and [`process`], which dispatches a request by its code as
//! `NettyRemotingAbstract.processRequestCommand` does.
//!
//! | codes | file | RocketMQ class |
//! |---|---|---|
//! | send 10, 310, 320; send back 36 | `send_message.rs` | `SendMessageProcessor` |
//! | pull 11, lite pull 361 (long polling) | `pull_message.rs` | `PullMessageProcessor`, `PullRequestHoldService` |
//! | query by key 12, view by id 33 | `query_message.rs` | `QueryMessageProcessor` |
//! | create topic 17, offsets 29-32, all topics 21, all consumer offsets 43 | `admin_broker.rs` | `AdminBrokerProcessor` |
//! | heartbeat 34, unregister 35 | `client_manage.rs` | `ClientManageProcessor` |
//! | consumer offsets 14, 15; consumer list 38 | `consumer_manage.rs` | `ConsumerManageProcessor` |
//! | route 105, cluster info 106 | `namesrv.rs` | the name server's `DefaultRequestProcessor` |
//!
//! Invariants:
//! * Every request gets exactly one [`Outcome`]: a one-way request never gets a reply,
//!   any other gets one response (a held pull's comes later, from [`serve_hold`]).
//! * Processors are async and know nothing of sockets, so both front ends (shard
//!   tasks, blocking threads) run the same code.
//! * Header fields are read by RocketMQ's names; a missing or malformed one is refused
//!   with `SYSTEM_ERROR` and a remark naming it, as RocketMQ's header decoding does.
//!   Unknown codes get `REQUEST_CODE_NOT_SUPPORTED`.
//! * A request for a queue owned by the shard this thread runs calls that store
//!   directly ([`set_local_shard`]); any other goes through the store's `Handle`.

mod admin_broker;
mod client_manage;
mod consumer_manage;
mod namesrv;
mod pull_message;
mod query_message;
mod send_message;

pub(crate) use pull_message::{Hold, Waiting, serve_hold};

use super::NodeState;
use super::state::{PERM_READ, PERM_WRITE, TopicConf};
use crate::node::remoting::RemotingCommand;
use crate::node::remoting::codes::*;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;

/// What the connection does with a request.
pub(crate) enum Outcome {
    Reply(RemotingCommand),
    /// A one-way request: nothing goes back.
    NoReply,
    /// A pull that found nothing, held until a message arrives or time runs out.
    Hold(Hold),
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
        SEND_MESSAGE | SEND_MESSAGE_V2 | SEND_BATCH_MESSAGE => {
            send_message::send(st, &req, peer).await
        }
        CONSUMER_SEND_MSG_BACK => send_message::send_back(st, &req).await,
        PULL_MESSAGE | LITE_PULL_MESSAGE => return pull_message::pull(st, req).await,
        QUERY_MESSAGE => query_message::query_message(st, &req).await,
        VIEW_MESSAGE_BY_ID => query_message::view_message(st, &req).await,
        UPDATE_AND_CREATE_TOPIC => admin_broker::create_topic(st, &req),
        GET_ALL_TOPIC_CONFIG => Ok(admin_broker::all_topic_config(st, &req)),
        GET_ALL_CONSUMER_OFFSET => Ok(admin_broker::all_consumer_offsets(st, &req)),
        GET_MAX_OFFSET | GET_MIN_OFFSET => admin_broker::queue_offset(st, &req).await,
        SEARCH_OFFSET_BY_TIMESTAMP => admin_broker::search_offset(st, &req).await,
        GET_EARLIEST_MSG_STORETIME => admin_broker::earliest_time(st, &req).await,
        HEART_BEAT => client_manage::heartbeat(st, &req, conn),
        UNREGISTER_CLIENT => client_manage::unregister(st, &req),
        QUERY_CONSUMER_OFFSET => consumer_manage::query_consumer_offset(st, &req).await,
        UPDATE_CONSUMER_OFFSET => consumer_manage::update_consumer_offset(st, &req),
        GET_CONSUMER_LIST_BY_GROUP => consumer_manage::consumer_list(st, &req),
        GET_ROUTEINFO_BY_TOPIC => namesrv::route(st, &req),
        GET_BROKER_CLUSTER_INFO => Ok(namesrv::cluster_info(st, &req)),
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

/// A refusal: response code and remark.
type Reject = (i32, String);

fn reject(code: i32, remark: impl Into<String>) -> Reject {
    (code, remark.into())
}

/// A store call that failed: `SYSTEM_ERROR` with the error as the remark.
fn store_error(e: crate::Error) -> Reject {
    reject(SYSTEM_ERROR, e.to_string())
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

/// The `topic` and `queueId` fields.
fn queue_args(req: &RemotingCommand) -> Result<(String, i32), Reject> {
    Ok((field(req, "topic")?.to_string(), num(req, "queueId")?))
}

fn ok(req: &RemotingCommand) -> RemotingCommand {
    RemotingCommand::response_to(req, SUCCESS, None)
}

/// RocketMQ's topic rule: 1..=127 characters of `[%|a-zA-Z0-9_-]`.
fn valid_topic(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= 127
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'%' | b'|' | b'_' | b'-'))
}

/// The topic's settings, creating it on first use when allowed (`create`; RocketMQ's
/// `TopicConfigManager.createTopicInSendMessageMethod`).
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
