//! The request processors: RocketMQ's broker `NettyRequestProcessor`s (the table
//! `BrokerController.registerProcessor` fills) plus the name server's answers, one file
//! per RocketMQ processor, and [`process`], which dispatches a request by its code as
//! `NettyRemotingAbstract.processRequestCommand` does.
//!
//! | codes | file | RocketMQ class |
//! |---|---|---|
//! | send 10, 310, 320; send back 36 | `send_message.rs` | `SendMessageProcessor` |
//! | end transaction 37 | `end_transaction.rs` | `EndTransactionProcessor` |
//! | pull 11, lite pull 361 (long polling) | `pull_message.rs` | `PullMessageProcessor`, `PullRequestHoldService` |
//! | query by key 12, view by id 33 | `query_message.rs` | `QueryMessageProcessor` |
//! | create topic 17, offsets 29-32, all topics 21, all consumer offsets 43 | `admin_broker.rs` | `AdminBrokerProcessor` |
//! | heartbeat 34, unregister 35 (members told with 40) | `client_manage.rs` | `ClientManageProcessor`, `DefaultConsumerIdsChangeListener` |
//! | consumer offsets 14, 15; consumer list 38 | `consumer_manage.rs` | `ConsumerManageProcessor` |
//! | route 105, cluster info 106 | `namesrv.rs` | the name server's `DefaultRequestProcessor` |
//! | runtime info 28, broker config 25/26, topic stats 202, delete topic 215 (list form 5002), clean unused topics 316, delete expired files 329; topic list 206, name-server delete 216 | `admin_store.rs` | `AdminBrokerProcessor` (store side) |
//! | reset offset by time 222 (consumers told with 220) | `admin_offset.rs` | `AdminBrokerProcessor.resetOffset`, `Broker2Client.resetOffset` |
//! | subscription groups 200/201/207 (list delete 5003), consume stats 208, queue locks 41/42, client config check 46, connection lists 203/204 | `admin_group.rs` | `AdminBrokerProcessor` (groups), `RebalanceLockManager` |
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
//!   directly ([`set_local_shard`], through [`LocalStore`]); any other goes through the
//!   store's `Handle`.
//!
//! Panics (issue 16: a division by zero on one request took a shard's executor, and its
//! store, down while the node kept accepting). glommio does not catch a task's panic:
//! it unwinds out of the executor and the shard is gone. So [`process`] and
//! [`serve_hold`] run each request under `catch_unwind`, and what is caught is sorted
//! by where it was raised:
//! * **In the node's own request code** (parsing, topic tables, responses): the request
//!   is answered `SYSTEM_ERROR` with a remark naming its code, the panic is logged at
//!   error level and counted (`coremq_request_panics_total`), and the shard and the
//!   connection go on. Safe because that code keeps nothing half-done that outlives the
//!   request: the node's tables sit behind mutexes taken without poisoning (each update
//!   is one insert or remove), `RefCell` borrows end with the unwind, and the in-flight
//!   and held-pull counts are guards dropped on the way out.
//! * **Inside the store** (a call made in place on this shard through [`LocalStore`]):
//!   the store may be left half-updated (a write window reserved, a queue entry
//!   half-built), and nothing here can tell. It is never swallowed: [`LocalStore`]
//!   marks the panic ([`StorePanic`]), the catch records the node's failure and lets
//!   it go on unwinding, so the shard stops as it would have (fail-stop: nothing more
//!   is written or acknowledged through that store) and the node reports it
//!   ([`crate::node::Node::failure`]; `coremq serve` then shuts the other shards down
//!   cleanly and exits with status 3). A store panic in a store task on any shard
//!   (work sent through the `Handle`, background tasks) never reaches this catch; it
//!   kills its executor directly and the node's watchdog reports the dead shard the
//!   same way.

mod admin_broker;
mod admin_group;
mod admin_offset;
mod admin_store;
mod client_manage;
mod consumer_manage;
mod end_transaction;
mod namesrv;
mod pool;
mod pull_message;
mod query_message;
pub(crate) mod reply;
mod send_message;

pub(crate) use admin_store::mq_key;
pub(crate) use pool::PooledString;
pub(crate) use pull_message::{Hold, Waiting};
pub(crate) use reply::{Reply, ReplyTo};
use send_message::Sent;
pub(crate) use send_message::There;

use super::NodeState;
use super::shard_view::ShardView;
use super::state::{PERM_READ, PERM_WRITE, TopicConf};
use crate::node::remoting::RemotingCommand;
use crate::node::remoting::codes::*;
use crate::node::remoting::headers::{PullHeader, SendHeader};
use bytes::Bytes;
use futures_lite::FutureExt;
use std::any::Any;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

/// What the connection does with a request.
pub(crate) enum Outcome {
    Reply(Reply),
    /// A one-way request: nothing goes back.
    NoReply,
    /// A pull that found nothing, held until a message arrives or time runs out.
    Hold(Hold),
}

/// Serves one request: its [`Outcome`], also when its handler panicked (see the module
/// docs; a panic inside the store is let through).
pub(crate) async fn process(
    st: &NodeState,
    req: RemotingCommand,
    conn: u64,
    peer: SocketAddr,
) -> Outcome {
    process_in_view(st, req, conn, peer, None).await
}

/// As [`process`], for a request that came to a shard's own port: its queue ids are
/// that shard's (`node::shard_view`).
pub(crate) async fn process_in_view(
    st: &NodeState,
    mut req: RemotingCommand,
    conn: u64,
    peer: SocketAddr,
    view: Option<ShardView>,
) -> Outcome {
    if let Some(v) = view {
        queue_id_to_global(&mut req, v);
    }
    let (code, oneway, to) = (req.code, req.is_oneway(), ReplyTo::of(&req));
    guarded(st, code, oneway, to, dispatch(st, req, conn, peer, view)).await
}

/// Rewrites the `queueId` field of a request naming one queue of a topic (offsets,
/// consumer offsets) from a shard's own id to the node's. Sends and pulls are
/// translated where they are read (also on the in-place path), queue locks are kept
/// under the shard broker's name and ids as the client gives them, and a field that
/// is missing or not a number is left for the handler to refuse.
fn queue_id_to_global(req: &mut RemotingCommand, v: ShardView) {
    if !matches!(
        req.code,
        QUERY_CONSUMER_OFFSET
            | UPDATE_CONSUMER_OFFSET
            | GET_MAX_OFFSET
            | GET_MIN_OFFSET
            | SEARCH_OFFSET_BY_TIMESTAMP
            | GET_EARLIEST_MSG_STORETIME
    ) {
        return;
    }
    let Some(topic) = req.field("topic").map(str::to_owned) else {
        return;
    };
    for (name, value) in &mut req.ext_fields {
        if name == "queueId"
            && let Ok(local) = value.trim().parse::<i32>()
            && let Some(global) = v.global(&topic, local)
        {
            *value = global.to_string();
        }
    }
}

/// Serves a send (10, 310, 320) whose header was read in place (the socket front
/// end's fast path, issue 20): the same processor and guard as [`process`]; a send
/// whose queue another shard owns is answered by that shard on `conn`
/// (`node::shared_out`).
pub(crate) async fn process_send(
    st: &NodeState,
    code: i32,
    oneway: bool,
    to: ReplyTo,
    header: &SendHeader<'_>,
    body: &Bytes,
    conn: &There,
) -> Outcome {
    guarded(st, code, oneway, to, async {
        st.metrics.request(local_shard());
        tracing::trace!(
            code,
            opaque = to.opaque,
            ?header,
            body = body.len(),
            "request"
        );
        let there = Some((conn, to, oneway));
        let r = send_message::send(st, code, header, body, conn.peer, there, conn.view).await;
        answer_send(oneway, to, r)
    })
    .await
}

/// Serves a pull (11, 361) whose header was read in place, as [`process_send`].
pub(crate) async fn process_pull(
    st: &NodeState,
    code: i32,
    oneway: bool,
    to: ReplyTo,
    header: &PullHeader<'_>,
    view: Option<ShardView>,
) -> Outcome {
    guarded(st, code, oneway, to, async {
        st.metrics.request(local_shard());
        tracing::trace!(code, opaque = to.opaque, ?header, "request");
        let outcome = pull_message::pull(st, code, to, header, view).await;
        if oneway { Outcome::NoReply } else { outcome }
    })
    .await
}

/// Runs a request's future under the panic catch (module docs).
///
/// A hand-written future, not an `async fn`: an `async fn` keeps the future it is
/// given as an argument and again inside its `catch_unwind`, so the request task
/// (spawned per request, which copies it whole) was twice the size of the work it
/// runs (a send's: 5,024 bytes, `size_of_val`).
fn guarded<F: std::future::Future<Output = Outcome>>(
    st: &NodeState,
    code: i32,
    oneway: bool,
    to: ReplyTo,
    serve: F,
) -> Guarded<'_, F> {
    Guarded {
        st,
        code,
        oneway,
        to,
        serve,
    }
}

/// [`guarded`]'s future.
struct Guarded<'a, F> {
    st: &'a NodeState,
    code: i32,
    oneway: bool,
    to: ReplyTo,
    serve: F,
}

impl<F: std::future::Future<Output = Outcome>> std::future::Future for Guarded<'_, F> {
    type Output = Outcome;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Outcome> {
        // SAFETY: `serve` is pinned with `self` (never moved out, not `Unpin`-exposed);
        // the other fields are plain values, only read.
        let this = unsafe { self.get_unchecked_mut() };
        let serve = unsafe { Pin::new_unchecked(&mut this.serve) };
        match std::panic::catch_unwind(AssertUnwindSafe(|| serve.poll(cx))) {
            Ok(p) => p,
            Err(panic) => {
                let remark = caught(this.st, this.code, "request", panic);
                Poll::Ready(if this.oneway {
                    Outcome::NoReply
                } else {
                    Outcome::Reply(Reply::Command(this.to.command(SYSTEM_ERROR, Some(remark))))
                })
            }
        }
    }
}

/// Serves a held pull (see [`pull_message::serve_hold`]) under the same catch as
/// [`process`].
pub(crate) async fn serve_hold(st: &NodeState, hold: Hold, how: Waiting) -> Reply {
    let (code, to) = (hold.request_code(), hold.reply_to());
    match AssertUnwindSafe(pull_message::serve_hold(st, hold, how))
        .catch_unwind()
        .await
    {
        Ok(resp) => resp,
        Err(panic) => {
            let remark = caught(st, code, "held pull", panic);
            Reply::Command(to.command(SYSTEM_ERROR, Some(remark)))
        }
    }
}

/// A panic raised inside the store, called in place through [`LocalStore`]: the catch
/// in [`process`] lets it through (the store may be half-updated).
pub(crate) struct StorePanic(Box<dyn Any + Send>);

/// The text of a panic's payload.
fn panic_text(panic: &(dyn Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else if let Some(StorePanic(inner)) = panic.downcast_ref::<StorePanic>() {
        panic_text(inner.as_ref())
    } else {
        "a panic without a message".to_string()
    }
}

/// Handles a panic caught while serving a request with `code`: the remark to answer
/// with, or, for a panic inside the store, the node's failure recorded and the panic
/// resumed (it takes this shard's executor down: fail-stop).
fn caught(st: &NodeState, code: i32, what: &str, panic: Box<dyn Any + Send>) -> String {
    st.metrics.request_panics.fetch_add(1, Ordering::Relaxed);
    let text = panic_text(panic.as_ref());
    if panic.is::<StorePanic>() {
        let why = format!(
            "the store panicked serving a {what} with request code {code}: {text}; \
             the shard stops (its store may be half-updated)"
        );
        st.fail(why);
        std::panic::resume_unwind(panic);
    }
    tracing::error!(
        code,
        panic = %text,
        "a {what} handler panicked; answered SYSTEM_ERROR, the shard goes on"
    );
    format!(
        "the broker failed serving request code {code}: the handler panicked: {}",
        clip(&text)
    )
}

/// Dispatches one request by its code.
async fn dispatch(
    st: &NodeState,
    req: RemotingCommand,
    conn: u64,
    peer: SocketAddr,
    view: Option<ShardView>,
) -> Outcome {
    st.metrics.request(local_shard());
    let oneway = req.is_oneway();
    tracing::trace!(code = req.code, opaque = req.opaque, fields = ?req.ext_fields, body = req.body.len(), "request");
    let to = ReplyTo::of(&req);
    let r = match req.code {
        SEND_MESSAGE | SEND_MESSAGE_V2 | SEND_BATCH_MESSAGE => {
            let h = SendHeader::from_command(&req);
            let r = send_message::send(st, req.code, &h, &req.body, peer, None, view).await;
            return answer_send(oneway, to, r);
        }
        CONSUMER_SEND_MSG_BACK => send_message::send_back(st, &req).await,
        END_TRANSACTION => end_transaction::end_transaction(st, &req, peer).await,
        PULL_MESSAGE | LITE_PULL_MESSAGE => {
            // A one-way pull is served (a commit offset it carries is stored) but never
            // answered, held or not.
            let outcome =
                pull_message::pull(st, req.code, to, &PullHeader::from_command(&req), view).await;
            return if oneway { Outcome::NoReply } else { outcome };
        }
        QUERY_MESSAGE => query_message::query_message(st, &req, view).await,
        VIEW_MESSAGE_BY_ID => query_message::view_message(st, &req).await,
        UPDATE_AND_CREATE_TOPIC => admin_broker::create_topic(st, &req),
        GET_ALL_TOPIC_CONFIG => Ok(admin_broker::all_topic_config(st, &req)),
        GET_ALL_CONSUMER_OFFSET => Ok(admin_broker::all_consumer_offsets(st, &req)),
        GET_MAX_OFFSET | GET_MIN_OFFSET => admin_broker::queue_offset(st, &req).await,
        SEARCH_OFFSET_BY_TIMESTAMP => admin_broker::search_offset(st, &req).await,
        GET_EARLIEST_MSG_STORETIME => admin_broker::earliest_time(st, &req).await,
        HEART_BEAT => client_manage::heartbeat(st, &req, conn, peer),
        GET_CONSUMER_CONNECTION_LIST => admin_group::consumer_connections(st, &req),
        GET_PRODUCER_CONNECTION_LIST => admin_group::producer_connections(st, &req),
        UNREGISTER_CLIENT => client_manage::unregister(st, &req),
        QUERY_CONSUMER_OFFSET => consumer_manage::query_consumer_offset(st, &req).await,
        UPDATE_CONSUMER_OFFSET => consumer_manage::update_consumer_offset(st, &req),
        GET_CONSUMER_LIST_BY_GROUP => consumer_manage::consumer_list(st, &req),
        GET_ROUTEINFO_BY_TOPIC => namesrv::route(st, &req),
        GET_BROKER_CLUSTER_INFO => Ok(namesrv::cluster_info(st, &req)),
        GET_BROKER_RUNTIME_INFO => admin_store::runtime_info(st, &req).await,
        GET_BROKER_CONFIG => admin_store::broker_config(st, &req).await,
        UPDATE_BROKER_CONFIG => admin_store::update_broker_config(st, &req).await,
        GET_TOPIC_STATS_INFO => admin_store::topic_stats(st, &req, view).await,
        DELETE_TOPIC_IN_BROKER => admin_store::delete_topic(st, &req).await,
        DELETE_TOPIC_IN_BROKER_LIST => admin_store::delete_topic_list(st, &req).await,
        CLEAN_UNUSED_TOPIC => admin_store::clean_unused_topics(st, &req).await,
        DELETE_EXPIRED_COMMITLOG => admin_store::delete_expired(st, &req).await,
        GET_ALL_TOPIC_LIST_FROM_NAMESERVER => Ok(admin_store::topic_list(st, &req)),
        DELETE_TOPIC_IN_NAMESRV => admin_store::namesrv_delete_topic(st, &req),
        UPDATE_AND_CREATE_SUBSCRIPTIONGROUP => admin_group::update_group(st, &req),
        GET_ALL_SUBSCRIPTIONGROUP_CONFIG => Ok(admin_group::all_groups(st, &req)),
        DELETE_SUBSCRIPTIONGROUP => admin_group::delete_group(st, &req),
        DELETE_SUBSCRIPTIONGROUP_LIST => admin_group::delete_group_list(st, &req),
        GET_CONSUME_STATS => admin_group::consume_stats(st, &req, view).await,
        LOCK_BATCH_MQ => admin_group::lock_batch(st, &req),
        UNLOCK_BATCH_MQ => admin_group::unlock_batch(st, &req),
        CHECK_CLIENT_CONFIG => admin_group::check_client_config(st, &req),
        INVOKE_BROKER_TO_RESET_OFFSET => admin_offset::reset_offset(st, &req, view).await,
        TEST_PANIC_IN_HANDLER if st.cfg.test_hooks => {
            panic!("test hook: request code {TEST_PANIC_IN_HANDLER} panics in its handler")
        }
        TEST_PANIC_IN_STORE if st.cfg.test_hooks => test_panic_in_store(st).await,
        other => Err(reject(
            REQUEST_CODE_NOT_SUPPORTED,
            format!(" request type {other} not supported"),
        )),
    };
    answer(oneway, to, r.map(Reply::Command))
}

/// A send's [`answer`]; none when the shard owning its queue answers it.
fn answer_send(oneway: bool, to: ReplyTo, r: Result<Sent, Reject>) -> Outcome {
    match r {
        Ok(Sent::Reply(r)) => answer(oneway, to, Ok(Reply::Send(r))),
        Ok(Sent::Elsewhere) => Outcome::NoReply,
        Err(e) => answer(oneway, to, Err(e)),
    }
}

/// A processor's result as the request's outcome: nothing for a one-way request, a
/// refusal as a response with its code and remark.
fn answer(oneway: bool, to: ReplyTo, r: Result<Reply, Reject>) -> Outcome {
    if oneway {
        return Outcome::NoReply;
    }
    Outcome::Reply(
        r.unwrap_or_else(|(code, remark)| Reply::Command(to.command(code, Some(remark)))),
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

/// The shard this thread runs (`None`: not a shard executor serving connections).
fn local_shard() -> Option<usize> {
    LOCAL_SHARD.with(|c| c.borrow().as_ref().map(|ctx| ctx.shard))
}

/// This thread's store, when this thread is the shard owning `(topic, queue_id)`.
fn local_owner(topic: &str, queue_id: i32) -> Option<LocalStore> {
    local_store_if(|ctx| ctx.owns(topic, queue_id))
}

/// This thread's store, when this thread is shard `shard` (the owner of a queue,
/// already found): [`local_owner`] without finding it again.
fn local_store_of(shard: usize) -> Option<LocalStore> {
    local_store_if(|ctx| ctx.shard == shard)
}

/// This thread's store, when this thread is a shard executor and `mine` holds for it.
fn local_store_if(mine: impl FnOnce(&crate::shard::ShardContext) -> bool) -> Option<LocalStore> {
    LOCAL_SHARD.with(|c| {
        c.borrow()
            .as_ref()
            .filter(|ctx| mine(ctx))
            .map(|ctx| LocalStore(ctx.store.clone()))
    })
}

/// This thread's shard store, called in place. The only way processors reach a store
/// without the `Handle`, so that every panic raised inside it is marked a
/// [`StorePanic`].
pub(crate) struct LocalStore(crate::store::Store);

impl LocalStore {
    pub(crate) async fn put(&self, msg: &crate::Message) -> crate::PutResult {
        in_store(self.0.put(msg)).await
    }

    pub(crate) async fn put_batch(&self, msgs: &[crate::Message]) -> crate::PutResult {
        in_store(self.0.put_batch(msgs)).await
    }

    pub(crate) async fn get(
        &self,
        topic: &str,
        queue_id: i32,
        offset: u64,
        max: usize,
        max_bytes: usize,
    ) -> crate::Result<crate::GetResult> {
        in_store(self.0.get(topic, queue_id, offset, max, max_bytes)).await
    }

    pub(crate) fn max_log_offset(&self) -> crate::LogOffset {
        self.0.max_log_offset()
    }

    pub(crate) async fn wait_dispatched(&self) {
        in_store(self.0.wait_dispatched()).await
    }
}

/// Polls `f`, marking any panic raised while it runs as the store's. A hand-written
/// future for the reason [`guarded`] is: the put's future is stored once, not twice.
fn in_store<F: std::future::Future>(f: F) -> InStore<F> {
    InStore(f)
}

/// [`in_store`]'s future.
struct InStore<F>(F);

impl<F: std::future::Future> std::future::Future for InStore<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // SAFETY: the one field is pinned with `self` and never moved out.
        let f = unsafe { self.map_unchecked_mut(|s| &mut s.0) };
        std::panic::catch_unwind(AssertUnwindSafe(|| f.poll(cx)))
            .unwrap_or_else(|panic| std::panic::resume_unwind(Box::new(StorePanic(panic))))
    }
}

/// `TEST_PANIC_IN_STORE` (only with `test_hooks`): a panic inside a store call. On a
/// shard front end it is raised in place through [`in_store`], as a store bug would be;
/// elsewhere in a task on shard 0, as a bug in routed store work would be.
async fn test_panic_in_store(st: &NodeState) -> Result<RemotingCommand, Reject> {
    let here = LOCAL_SHARD.with(|c| c.borrow().is_some());
    if here {
        in_store(async { test_store_panic() }).await;
    } else {
        let _ = st.handle.run_on(0, |_| async { test_store_panic() }).await;
    }
    Err(reject(SYSTEM_ERROR, "the store's shard stopped"))
}

fn test_store_panic() {
    panic!("test hook: request code {TEST_PANIC_IN_STORE} panics inside the store")
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

/// Most characters of a request's value echoed in a remark.
const ECHO_CHARS: usize = 64;

/// `s` for a remark: control characters escaped, cut to [`ECHO_CHARS`] characters
/// with its length named. A remark echoing a whole value grew the response up to six
/// times the request (a 15 MiB topic of `\x01` bytes made a 90 MiB remark, and a
/// header over 16 MiB cannot be framed).
fn clip(s: &str) -> String {
    let mut out: String = s
        .chars()
        .take(ECHO_CHARS)
        .flat_map(char::escape_debug)
        .collect();
    if s.chars().nth(ECHO_CHARS).is_some() {
        out.push_str(&format!("... ({} bytes)", s.len()));
    }
    out
}

fn field<'a>(req: &'a RemotingCommand, name: &str) -> Result<&'a str, Reject> {
    need(req.field(name), name)
}

fn num<T: std::str::FromStr>(req: &RemotingCommand, name: &str) -> Result<T, Reject> {
    num_of(req.field(name), name)
}

fn opt_num<T: std::str::FromStr>(req: &RemotingCommand, name: &str) -> Result<Option<T>, Reject> {
    opt_num_of(req.field(name), name)
}

/// A header field's value (`v`, found under `name`), refused when absent.
fn need<'a>(v: Option<&'a str>, name: &str) -> Result<&'a str, Reject> {
    v.ok_or_else(|| reject(SYSTEM_ERROR, format!("the custom field <{name}> is null")))
}

/// A header field's value as a number, refused when absent or not a number.
fn num_of<T: std::str::FromStr>(v: Option<&str>, name: &str) -> Result<T, Reject> {
    let v = need(v, name)?;
    v.trim().parse().map_err(|_| {
        reject(
            SYSTEM_ERROR,
            format!("the custom field <{name}> is not a number: \"{}\"", clip(v)),
        )
    })
}

/// A header field's value as a number when present, refused when not a number.
fn opt_num_of<T: std::str::FromStr>(v: Option<&str>, name: &str) -> Result<Option<T>, Reject> {
    match v {
        None => Ok(None),
        Some(_) => num_of(v, name).map(Some),
    }
}

/// The `topic` and `queueId` fields.
fn queue_args(req: &RemotingCommand) -> Result<(String, i32), Reject> {
    Ok((field(req, "topic")?.to_string(), num(req, "queueId")?))
}

fn ok(req: &RemotingCommand) -> RemotingCommand {
    RemotingCommand::response_to(req, SUCCESS, None)
}

/// RocketMQ's group-name rule: 1..=255 characters of `[%|a-zA-Z0-9_-]`.
pub(crate) fn valid_name(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= 255
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'%' | b'|' | b'_' | b'-'))
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
            format!(
                "topic \"{}\" is not a valid topic name ([%|a-zA-Z0-9_-]{{1,127}})",
                clip(topic)
            ),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A request's future with 2 KiB of state kept across an await.
    async fn work() -> Outcome {
        let big = [1u8; 2048];
        futures_lite::future::yield_now().await;
        std::hint::black_box(&big);
        Outcome::NoReply
    }

    fn guarded_size<F>(_: &F) -> usize {
        std::mem::size_of::<Guarded<'static, F>>()
    }

    /// The catches hold the work's future once: the request task is spawned (copied
    /// whole) per request, so each byte here is copied for every message.
    #[test]
    fn the_catches_add_no_copy_of_the_work() {
        let f = work();
        let inner = std::mem::size_of_val(&f);
        assert!(inner >= 2048);
        assert!(
            guarded_size(&f) <= inner + 64,
            "{} vs {inner}",
            guarded_size(&f)
        );
        let f = in_store(work());
        assert!(std::mem::size_of_val(&f) <= inner + 16);
    }

    /// A panic inside `in_store` is marked as the store's.
    #[test]
    fn in_store_marks_a_panic_as_the_stores() {
        let caught = std::panic::catch_unwind(|| {
            futures_lite::future::block_on(in_store(async { panic!("inside") }))
        });
        let panic = caught.expect_err("the panic goes on");
        let text = panic_text(panic.as_ref());
        assert!(panic.is::<StorePanic>(), "marked");
        assert_eq!(text, "inside");
    }
}
