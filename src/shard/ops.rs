//! The store's operations over many shards, written once.
//!
//! [`Route`] is the transport: how to run a piece of work on the [`Store`] of a given
//! shard. [`Handle`](super::Handle) routes over the shard's channel from any thread;
//! [`ShardContext`](super::ShardContext) calls its own shard's store directly and
//! routes the rest through its handle. [`StoreOps`] holds the operations of
//! RocketMQ's `MessageStore` (put, get, look-ups, offsets, key queries) as provided
//! methods over any `Route`, and `impl<R: Route> StoreOps for R` gives them to both.
//! Adding an operation is one `Store` method plus one provided method here.
//!
//! Each operation picks its shard (the queue's owner, or the shard an offset names)
//! and hands [`Route::run_at`] the borrowed arguments it needs on the shard. Arguments
//! travel separately from the closure so that the shard-local path borrows them: a
//! `get` on the calling shard copies nothing, and a routed one copies its topic once.
//!
//! Statuses follow the single-shard store's, plus: a put whose shard cannot take it
//! (shut down, thread gone) is `ServiceNotAvailable`; other operations return
//! [`Error::ShutDown`], [`Error::ShardUnavailable`], or `BadRequest` for a shard that
//! does not exist.

use super::ownership::shard_of_offset;
use crate::error::{Error, Result};
use crate::format::msg_id::{MessageId, MessageIds};
use crate::message::*;
use crate::store::Store;
use std::future::Future;

/// Runs work on a shard's [`Store`].
pub trait Route {
    /// How many shards the store has.
    fn shards(&self) -> usize;

    /// The shard that owns `(topic, queue_id)`, by the store's ownership rule.
    fn owner(&self, topic: &str, queue_id: i32) -> usize;

    /// Runs `f(store, args)` on `shard`'s executor and returns its result.
    ///
    /// When `shard` is the caller's own (a [`ShardContext`](super::ShardContext) on its
    /// shard) `f` runs in place, borrowing `args`. Otherwise `args` is copied once with
    /// `to_owned`, `f` and the copy travel to the shard in one boxed job, and `f` runs
    /// there as a task; its future may be `!Send`. Errors: [`Error::ShutDown`] after
    /// shutdown, `BadRequest` for a shard that does not exist, [`Error::ShardUnavailable`]
    /// when the shard's thread is gone (also when it dies before answering).
    fn run_at<A, T, F>(&self, shard: usize, args: &A, f: F) -> impl Future<Output = Result<T>>
    where
        A: ?Sized + ToOwned,
        A::Owned: Send + 'static,
        T: Send + 'static,
        F: AsyncFnOnce(&Store, &A) -> T + Send + 'static;
}

/// A shard's positions and health.
#[derive(Debug, Clone)]
pub struct ShardStatus {
    pub shard: usize,
    pub min_log_offset: LogOffset,
    pub max_log_offset: LogOffset,
    pub committed_log_offset: LogOffset,
    pub flushed_log_offset: LogOffset,
    pub dispatched_log_offset: LogOffset,
    pub failure: Option<String>,
}

/// The store's operations for any [`Route`]: bring it into scope (`use
/// coremq::StoreOps`, or `use coremq::prelude::*`) to call them on a
/// [`Handle`](super::Handle) or a [`ShardContext`](super::ShardContext).
///
/// `async fn` in a public trait cannot promise `Send` futures, hence the allowed
/// `async_fn_in_trait` lint. It is fine here: a provided method's future is `Send`
/// exactly when the route's `run_at` future is, and for `Handle` it is, which a
/// compile-time check in `handle.rs` holds for every operation.
#[allow(async_fn_in_trait)]
pub trait StoreOps: Route {
    /// Stores one message on the shard that owns its queue.
    async fn put(&self, msg: Message) -> PutResult {
        let shard = self.owner(&msg.topic, msg.queue_id);
        self.run_at(shard, &(), async move |s, _| s.put(msg).await)
            .await
            .unwrap_or_else(|_| PutResult::refused(PutStatus::ServiceNotAvailable))
    }

    /// Stores one message on the shard that owns its queue, like [`StoreOps::put`], and
    /// hands the message back (`None` when the shard is gone): a caller that reuses its
    /// messages keeps their strings, which are freed, if ever, by the thread that
    /// allocated them. (The node's routed sends: a message dropped on the owning shard
    /// freed its ~10 strings across threads, each `free` taking the allocating thread's
    /// glibc arena lock.)
    async fn put_and_return(&self, msg: Message) -> (PutResult, Option<Message>) {
        let shard = self.owner(&msg.topic, msg.queue_id);
        self.run_at(shard, &(), async move |s, _| {
            let r = s.put(&msg).await;
            (r, msg)
        })
        .await
        .map_or_else(
            |_| (PutResult::refused(PutStatus::ServiceNotAvailable), None),
            |(r, msg)| (r, Some(msg)),
        )
    }

    /// Stores messages that may span queues and shards: each queue's messages are put
    /// as one RocketMQ batch on its shard, the shards work in parallel, and the result
    /// has one entry per message, in input order.
    async fn put_batch(&self, msgs: Vec<Message>) -> Vec<PutResult> {
        let n = msgs.len();
        // One group per queue: (input positions, messages).
        let mut groups: Vec<(Vec<usize>, Vec<Message>)> = Vec::new();
        for (i, m) in msgs.into_iter().enumerate() {
            let same = groups
                .iter_mut()
                .find(|(_, ms)| ms[0].queue_id == m.queue_id && ms[0].topic == m.topic);
            match same {
                Some((idx, ms)) => {
                    idx.push(i);
                    ms.push(m);
                }
                None => groups.push((vec![i], vec![m])),
            }
        }
        let futs = groups.into_iter().map(|(idx, ms)| {
            let shard = self.owner(&ms[0].topic, ms[0].queue_id);
            async move {
                let r = self
                    .run_at(shard, &(), async move |s, _| s.put_batch(&ms).await)
                    .await
                    .unwrap_or_else(|_| PutResult::refused(PutStatus::ServiceNotAvailable));
                (idx, r)
            }
        });
        let mut out = vec![PutResult::refused(PutStatus::ServiceNotAvailable); n];
        for (idx, r) in crate::wake::join_all(futs.collect()).await {
            for (k, i) in idx.into_iter().enumerate() {
                let mut one = r.clone();
                if r.status.is_stored() {
                    one.queue_offset = r.queue_offset + k as u64;
                    one.msg_ids = MessageIds::from(r.msg_ids[k]);
                    one.log_offset = r.msg_ids[k].offset;
                }
                out[i] = one;
            }
        }
        out
    }

    /// Reads up to `max_count` messages (and about `max_bytes`) of a queue from
    /// `offset`, with RocketMQ's get statuses and next-begin-offset rules.
    async fn get(
        &self,
        topic: &str,
        queue_id: i32,
        offset: QueueOffset,
        max_count: usize,
        max_bytes: usize,
    ) -> Result<GetResult> {
        let shard = self.owner(topic, queue_id);
        self.run_at(shard, topic, async move |s, topic| {
            s.get(topic, queue_id, offset, max_count, max_bytes).await
        })
        .await?
    }

    /// Decodes the record at a commit-log offset (which names its shard).
    async fn look_by_offset(&self, offset: LogOffset) -> Result<Option<StoredMessage>> {
        self.run_at(shard_of_offset(offset), &(), async move |s, _| {
            s.look_by_offset(offset).await
        })
        .await?
    }

    /// Looks a message up by its 32-character offset message id.
    async fn look_by_msg_id(&self, id: &str) -> Result<Option<StoredMessage>> {
        let parsed = MessageId::parse(id).ok_or_else(|| {
            Error::BadRequest(format!(
                "malformed message id {id:?} (want 32 hex characters)"
            ))
        })?;
        let shard = shard_of_offset(parsed.offset);
        if shard >= self.shards() {
            return Err(Error::BadRequest(format!(
                "message id {id} names shard {shard}, but this store has {} shards",
                self.shards()
            )));
        }
        self.look_by_offset(parsed.offset).await
    }

    /// (min, max) queue offsets; max is the next offset to be written.
    async fn queue_offsets(
        &self,
        topic: &str,
        queue_id: i32,
    ) -> Result<(QueueOffset, QueueOffset)> {
        let shard = self.owner(topic, queue_id);
        self.run_at(shard, topic, async move |s, topic| {
            (
                s.min_queue_offset(topic, queue_id),
                s.max_queue_offset(topic, queue_id),
            )
        })
        .await
    }

    /// The first queue offset whose message was stored at or after `ts_ms`, as
    /// [`Store::queue_offset_by_time`].
    async fn queue_offset_by_time(
        &self,
        topic: &str,
        queue_id: i32,
        ts_ms: i64,
    ) -> Result<QueueOffset> {
        let shard = self.owner(topic, queue_id);
        self.run_at(shard, topic, async move |s, topic| {
            s.queue_offset_by_time(topic, queue_id, ts_ms).await
        })
        .await?
    }

    /// Store time of the queue's first message, or -1 when it has none.
    async fn earliest_message_time(&self, topic: &str, queue_id: i32) -> Result<i64> {
        let shard = self.owner(topic, queue_id);
        self.run_at(shard, topic, async move |s, topic| {
            s.earliest_message_time(topic, queue_id).await
        })
        .await?
    }

    /// Messages of `topic` carrying `key` stored within `[begin_ms, end_ms]`, from every
    /// shard (a key can be on any shard: ownership is by queue), asked in parallel and
    /// merged newest first by store time, at most `max` (clamped to `query_max`). Same
    /// rules as [`Store::query_by_key`]; a shard that fails makes the query fail.
    async fn query_by_key(
        &self,
        topic: &str,
        key: &str,
        max: usize,
        begin_ms: i64,
        end_ms: i64,
    ) -> Result<Vec<StoredMessage>> {
        crate::index::check_query(topic, key, begin_ms, end_ms)?;
        if max == 0 {
            return Ok(Vec::new());
        }
        let asks = (0..self.shards()).map(|shard| {
            let (topic, key) = (topic.to_string(), key.to_string());
            self.run_at(shard, &(), async move |s, _| {
                let max = max.min(s.config().query_max);
                let hits = s.query_by_key(&topic, &key, max, begin_ms, end_ms).await;
                hits.map(|h| (max, h))
            })
        });
        let (mut all, mut max) = (Vec::new(), max);
        for r in crate::wake::join_all(asks.collect()).await {
            let (shard_max, hits) = r??;
            max = max.min(shard_max);
            all.extend(hits);
        }
        all.sort_by_key(|m: &StoredMessage| {
            std::cmp::Reverse((m.store_timestamp_ms, m.log_offset))
        });
        all.truncate(max);
        Ok(all)
    }

    /// Positions and health of one shard.
    async fn shard_status(&self, shard: usize) -> Result<ShardStatus> {
        self.run_at(shard, &(), async move |s, _| ShardStatus {
            shard,
            min_log_offset: s.min_log_offset(),
            max_log_offset: s.max_log_offset(),
            committed_log_offset: s.committed_log_offset(),
            flushed_log_offset: s.flushed_log_offset(),
            dispatched_log_offset: s.dispatched_log_offset(),
            failure: s.failure(),
        })
        .await
    }

    /// Waits until every shard has made everything written so far visible to `get`.
    async fn wait_dispatched(&self) -> Result<()> {
        for shard in 0..self.shards() {
            self.run_at(shard, &(), async |s, _| s.wait_dispatched().await)
                .await?;
        }
        Ok(())
    }

    /// Commits and fdatasyncs every shard.
    async fn flush(&self) -> Result<()> {
        for shard in 0..self.shards() {
            self.run_at(shard, &(), async |s, _| s.flush().await)
                .await??;
        }
        Ok(())
    }

    /// A retention pass on every shard now, expired segments going whatever the hour
    /// (RocketMQ's `executeDeleteFilesManually`; [`Store::delete_expired_files`]), one
    /// report per shard.
    async fn delete_expired_files(&self) -> Result<Vec<crate::clean::PassReport>> {
        let asks = (0..self.shards())
            .map(|shard| self.run_at(shard, &(), async |s, _| s.delete_expired_files().await));
        let mut out = Vec::new();
        for r in crate::wake::join_all(asks.collect()).await {
            out.push(r??);
        }
        Ok(out)
    }

    /// Replaces the retention settings of every shard ([`Store::set_retention_config`]).
    async fn set_retention_config(&self, cfg: crate::config::RetentionConfig) -> Result<()> {
        for shard in 0..self.shards() {
            let cfg = cfg.clone();
            self.run_at(shard, &(), async move |s, _| s.set_retention_config(cfg))
                .await??;
        }
        Ok(())
    }

    /// The retention settings in use (shard 0's; every shard has the same).
    async fn retention_config(&self) -> Result<crate::config::RetentionConfig> {
        self.run_at(0, &(), async |s, _| s.retention_config()).await
    }

    /// The retention counters of every shard.
    async fn retention_stats(&self) -> Result<Vec<crate::clean::CleanStats>> {
        let mut out = Vec::new();
        for shard in 0..self.shards() {
            out.push(
                self.run_at(shard, &(), async |s, _| s.retention_stats())
                    .await?,
            );
        }
        Ok(out)
    }

    /// Every shard's statistics ([`Store::stats`], asked in parallel) and their sum.
    async fn stats(&self) -> Result<StatsReport> {
        let asks = (0..self.shards()).map(|shard| self.run_at(shard, &(), async |s, _| s.stats()));
        let mut shards = Vec::new();
        for r in crate::wake::join_all(asks.collect()).await {
            shards.push(r?);
        }
        let total = crate::stats::StoreStats::total(&shards);
        Ok(StatsReport { shards, total })
    }

    /// Deletes `topic`'s queues on every shard (RocketMQ's `deleteTopics`;
    /// [`Store::delete_topic`]); returns how many queues went.
    async fn delete_topic(&self, topic: &str) -> Result<usize> {
        let mut n = 0;
        for shard in 0..self.shards() {
            n += self
                .run_at(shard, topic, async |s, t| s.delete_topic(t).await)
                .await??;
        }
        Ok(n)
    }

    /// Deletes, on every shard, the topics not in `keep` (RocketMQ's
    /// `cleanUnusedTopic`; [`Store::clean_unused_topics`]); returns them.
    async fn clean_unused_topics(&self, keep: Vec<String>) -> Result<Vec<String>> {
        let keep: std::collections::HashSet<String> = keep.into_iter().collect();
        let mut out = std::collections::BTreeSet::new();
        for shard in 0..self.shards() {
            let keep = keep.clone();
            let done = self
                .run_at(shard, &(), async move |s, _| {
                    s.clean_unused_topics(&keep).await
                })
                .await??;
            out.extend(done);
        }
        Ok(out.into_iter().collect())
    }
}

/// Every shard's statistics and their sum ([`StoreOps::stats`]).
#[derive(Debug, Clone, Default)]
pub struct StatsReport {
    /// One per shard, in shard order.
    pub shards: Vec<crate::stats::StoreStats>,
    pub total: crate::stats::StoreStats,
}

impl<R: Route> StoreOps for R {}
