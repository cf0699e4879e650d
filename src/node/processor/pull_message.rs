//! RocketMQ's `PullMessageProcessor` (`PULL_MESSAGE`, 11; `LITE_PULL_MESSAGE`, 361) and
//! its long polling, RocketMQ's `PullRequestHoldService`.
//!
//! * A pull maps the store's `GetStatus` to RocketMQ's pull codes and next-begin
//!   offset as `PullMessageProcessor` does; a subscription (`tag1 || tag2`) filters
//!   records by their `TAGS` property on the broker.
//! * A pull with the commit-offset flag stores the group's offset before it reads.
//! * `suggestWhichBrokerId`: 1 (the slave) when a master's consumer reads fall far
//!   behind the log's end (RocketMQ's 40%-of-memory rule, [`suggest_broker`]), else 0.
//! * Long polling: a pull with the suspend flag that finds nothing is held ([`Hold`])
//!   until an arrival in its queue, its `suspendTimeoutMillis` (capped by
//!   `max_suspend_ms`) or shutdown, then answered with what a pull finds then.
//!   Holds are bounded by `max_held_pulls` (each costs a task, or a thread with
//!   `network = "threads"`); beyond it a pull is answered at once.
//! * A held pull looks again at least every second besides the arrival signals, as
//!   RocketMQ's hold service checks every few seconds, and waits for the owning shard's
//!   dispatch before each look, because a put returns before dispatch makes its record
//!   visible to pulls.

use super::reply::{PullReply, Reply, ReplyTo};
use super::{NodeState, Outcome, Reject, local_owner, need, num_of, opt_num_of, topic_conf};
use crate::StoreOps;
use crate::format::properties;
use crate::message::GetStatus;
use crate::node::remoting::codes::*;
use crate::node::remoting::headers::{PullField, PullHeader};
use crate::node::shard_view::ShardView;
use bytes::Bytes;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// `PullMessageRequestHeader`, parsed.
#[derive(Debug, Clone)]
struct PullArgs {
    group: String,
    topic: String,
    queue_id: i32,
    offset: u64,
    max: usize,
    sys_flag: i32,
    commit_offset: i64,
    suspend_ms: u64,
    /// Tags asked for; empty = every message.
    tags: Vec<String>,
}

const PULL_FLAG_COMMIT_OFFSET: i32 = 1;
const PULL_FLAG_SUSPEND: i32 = 2;
/// Most messages one pull returns (RocketMQ caps at 32 by default; clients ask 32).
const PULL_MAX_MESSAGES: usize = 1024;

fn parse_pull(h: &PullHeader<'_>) -> Result<PullArgs, Reject> {
    let topic = need(h.get(PullField::Topic), "topic")?.to_string();
    let offset: i64 = num_of(h.get(PullField::QueueOffset), "queueOffset")?;
    let max: i64 = opt_num_of(h.get(PullField::MaxMsgNums), "maxMsgNums")?.unwrap_or(32);
    let sub = h.get(PullField::Subscription).unwrap_or("*").trim();
    // Only tag expressions are served: any other type (SQL92) is refused with
    // RocketMQ's answer for a broker without property filtering, never matched
    // against tags.
    if let Some(kind) = h.get(PullField::ExpressionType)
        && !kind.eq_ignore_ascii_case("TAG")
    {
        return Err(super::reject(
            SYSTEM_ERROR,
            format!(
                "The broker does not support consumer to filter message by {}",
                super::clip(kind)
            ),
        ));
    }
    let tags = if sub.is_empty() || sub == "*" {
        Vec::new()
    } else {
        sub.split("||")
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty())
            .collect()
    };
    Ok(PullArgs {
        group: h.get(PullField::ConsumerGroup).unwrap_or("").to_string(),
        topic,
        queue_id: num_of(h.get(PullField::QueueId), "queueId")?,
        offset: offset.max(0) as u64,
        max: max.clamp(1, PULL_MAX_MESSAGES as i64) as usize,
        sys_flag: opt_num_of(h.get(PullField::SysFlag), "sysFlag")?.unwrap_or(0),
        commit_offset: opt_num_of(h.get(PullField::CommitOffset), "commitOffset")?.unwrap_or(-1),
        suspend_ms: opt_num_of::<i64>(
            h.get(PullField::SuspendTimeoutMillis),
            "suspendTimeoutMillis",
        )?
        .unwrap_or(0)
        .max(0) as u64,
        tags,
    })
}

/// Serves a pull (request `code`, answered to `to`): answers it, or holds it when it
/// found nothing and may wait.
pub(super) async fn pull(
    st: &NodeState,
    code: i32,
    to: ReplyTo,
    h: &PullHeader<'_>,
    view: Option<ShardView>,
) -> Outcome {
    let args = match parse_pull(h) {
        // On a shard's own port the id is that shard's (`node::shard_view`); one past
        // its count maps past the topic's and is refused as such.
        Ok(mut a) => {
            if let Some(v) = view
                && let Some(global) = v.global(&a.topic, a.queue_id)
            {
                a.queue_id = global;
            }
            a
        }
        Err((code, remark)) => {
            return Outcome::Reply(Reply::Command(to.command(code, Some(remark))));
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
    let resp = pull_once(st, to, &args).await;
    let suspend = args.sys_flag & PULL_FLAG_SUSPEND != 0 && args.suspend_ms > 0;
    if resp.code() == PULL_NOT_FOUND
        && suspend
        && st.cfg.long_polling
        && !st.shutting.load(Ordering::SeqCst)
    {
        let (counted, before) = HeldGuard::take(&st.held);
        // Beyond the limit the pull is answered at once (the guard un-counts it).
        if before < st.cfg.max_held_pulls {
            // `max_suspend_ms` is bounded by config validation, so this cannot overflow.
            let hold_ms = args.suspend_ms.min(st.cfg.max_suspend_ms);
            let now = Instant::now();
            return Outcome::Hold(Hold {
                _counted: counted,
                code,
                to,
                pull: args,
                seen,
                deadline: now
                    .checked_add(Duration::from_millis(hold_ms))
                    .unwrap_or(now),
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
async fn pull_once(st: &NodeState, to: ReplyTo, a: &PullArgs) -> Reply {
    let conf = match topic_conf(st, &a.topic, false) {
        Ok(c) => c,
        Err((code, remark)) => return Reply::Command(to.command(code, Some(remark))),
    };
    if a.queue_id < 0 || a.queue_id >= conf.read_queue_nums.max(conf.write_queue_nums) {
        return Reply::Command(to.command(
            SYSTEM_ERROR,
            Some(format!(
                "queueId[{}] is illegal, topic:[{}] topicConfig.readQueueNums:[{}]",
                a.queue_id, a.topic, conf.read_queue_nums
            )),
        ));
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
            return Reply::Command(to.command(SYSTEM_ERROR, Some(e.to_string())));
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
    let suggest = suggest_broker(st, a, &records).await;
    if code == SUCCESS {
        let shard = st.handle.shard_of(&a.topic, a.queue_id);
        let total: usize = records.iter().map(Bytes::len).sum();
        let m = st.metrics.shard(shard);
        m.gets.fetch_add(records.len() as u64, Ordering::Relaxed);
        m.get_bytes.fetch_add(total as u64, Ordering::Relaxed);
    }
    // The records go to the socket as the store's buffers (`Reply::encode_into`).
    Reply::Pull(PullReply {
        code,
        remark: (!remark.is_empty()).then_some(remark),
        suggest_broker: suggest,
        next_begin_offset: g.next_begin_offset,
        min_offset: g.min_offset,
        max_offset: g.max_offset,
        records,
    })
}

/// RocketMQ's `accessMessageInMemoryMaxRatio` (40%): a pull whose last record lies more
/// than this share of the machine's memory behind the log's end reads from disk.
const IN_MEMORY_MAX_PERCENT: u64 = 40;

/// The machine's memory in bytes (0 when unknown), read once.
fn total_memory() -> u64 {
    static MEM: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *MEM.get_or_init(|| {
        // SAFETY: sysconf only reads system constants.
        let (pages, page) = unsafe {
            (
                libc::sysconf(libc::_SC_PHYS_PAGES),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        (pages.max(0) as u64).saturating_mul(page.max(0) as u64)
    })
}

/// `suggestWhichBrokerId`, RocketMQ's rule: a master whose consumer reads fall far
/// behind (the last record pulled lies more than 40% of memory below the log's end)
/// suggests its slave (broker id 1, `whichBrokerWhenConsumeSlowly`); otherwise, and on
/// a slave, the master (0).
async fn suggest_broker(st: &NodeState, a: &PullArgs, records: &[Bytes]) -> u64 {
    let Some(last) = records.last() else {
        return 0;
    };
    if st.broker_id != 0 || st.cfg.ha_role() == Some(crate::config::HaRole::Slave) {
        return 0;
    }
    let at = crate::format::record::PHYS_OFFSET_AT;
    let Some(phys) = last
        .get(at..at + 8)
        .map(|b| i64::from_be_bytes(b.try_into().unwrap_or([0; 8])).max(0) as u64)
    else {
        return 0;
    };
    let end = match local_owner(&a.topic, a.queue_id) {
        Some(store) => store.max_log_offset(),
        None => {
            let shard = st.handle.shard_of(&a.topic, a.queue_id);
            match st.handle.shard_status(shard).await {
                Ok(s) => s.max_log_offset,
                Err(_) => return 0,
            }
        }
    };
    let far = total_memory() / 100 * IN_MEMORY_MAX_PERCENT;
    if far > 0 && end.saturating_sub(phys) > far {
        1
    } else {
        0
    }
}

// ---------------------------------------------------------------------------------
// long polling (RocketMQ's `PullRequestHoldService`)

/// A pull waiting for its queue to move.
pub(crate) struct Hold {
    /// Counts this hold in `NodeState::held` while it lives.
    _counted: HeldGuard,
    /// The request's code, and where its answer goes.
    code: i32,
    to: ReplyTo,
    pull: PullArgs,
    /// The queue's arrival counter read before the first attempt.
    seen: u64,
    deadline: Instant,
}

impl Hold {
    /// The held request's code.
    pub(crate) fn request_code(&self) -> i32 {
        self.code
    }

    /// Where the held request's answer goes.
    pub(crate) fn reply_to(&self) -> ReplyTo {
        self.to
    }
}

/// Decrements the count of held pulls when a hold ends (answered or dropped).
struct HeldGuard(Arc<AtomicUsize>);

impl HeldGuard {
    /// Counts one more hold; returns the guard and the count before.
    fn take(held: &Arc<AtomicUsize>) -> (HeldGuard, usize) {
        let before = held.fetch_add(1, Ordering::SeqCst);
        (HeldGuard(held.clone()), before)
    }
}

impl Drop for HeldGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
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
pub(crate) async fn serve_hold(st: &NodeState, hold: Hold, how: Waiting) -> Reply {
    let a = &hold.pull;
    let mut seen = hold.seen;
    // A message put just before this pull may not have been dispatched yet.
    wait_dispatched(st, a).await;
    let resp = pull_once(st, hold.to, a).await;
    if resp.code() != PULL_NOT_FOUND {
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
        let resp = pull_once(st, hold.to, a).await;
        if resp.code() != PULL_NOT_FOUND || done {
            return resp;
        }
    }
}
