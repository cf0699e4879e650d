//! Retention on the store: the cleaner's view of it ([`crate::clean::Owner`]) and the
//! operations RocketMQ's `MessageStore` offers around it: `executeDeleteFilesManually`
//! ([`Store::delete_expired_files`]), `deleteTopics` ([`Store::delete_topic`]) and
//! `cleanUnusedTopic` ([`Store::clean_unused_topics`]).
//!
//! Deleting a topic (RocketMQ destroys its ConsumeQueues and leaves its records to
//! age out of the CommitLog; so does this):
//! 1. dispatch catches up with what was written, so every record of the topic has
//!    its entry or is in the log;
//! 2. with the checkpoint rounds held off (no queue flush may create files in the
//!    topic's directory meanwhile), in one step with no await: the topic is marked
//!    deleted below the log's end (dispatch skips its records from now on, also those
//!    still to dispatch) and its queues leave the table (a put from now on starts a
//!    new queue at offset 0);
//! 3. the mark is made durable (`config/deleted-topics`), then the queue directories
//!    are removed, then a checkpoint is written without them.
//!
//! A crash before step 3's mark is durable leaves the topic as it was; after it, the
//! next open finds the mark and removes what is left of the old queues. A rebuild of
//! the queues from the log never brings the topic's records back, and key queries
//! skip them.

use super::checkpoint::IndexFlush;
use super::{Inner, State, Store};
use crate::clean::{self, CleanStats, Cleaner, PassReport};
use crate::commit_log::CommitLog;
use crate::consume_queue::QueueTable;
use crate::error::{Error, Result};
use crate::index::IndexService;
use std::collections::HashSet;

impl clean::Owner for Inner {
    fn log(&self) -> &CommitLog {
        &self.log
    }

    fn queues(&self) -> &QueueTable {
        &self.queues
    }

    fn index(&self) -> Option<&IndexService> {
        self.index.as_deref()
    }

    fn cleaner(&self) -> &Cleaner {
        &self.clean
    }

    /// Durable, dispatched, covered by the last checkpoint (so recovery never needs
    /// what goes), and, with `keep_for_slaves`, reported by every connected slave.
    fn deletable_below(&self) -> u64 {
        let (dispatch_safe, flushed) = self.checkpointed.get();
        let mut limit = dispatch_safe
            .min(flushed)
            .min(self.dispatched.get())
            .min(self.log.flushed.get());
        if self.cfg.retention.keep_for_slaves
            && let Some(slave) = self.transfer.lowest_report()
        {
            limit = limit.min(slave);
        }
        limit
    }

    fn disk_space(&self) -> Option<(u64, u64)> {
        self.cfg.disk.space(&self.cfg.root).ok().flatten()
    }

    fn disk_full_ratio(&self) -> f64 {
        self.cfg.disk_full_ratio
    }

    fn disk_reserve_bytes(&self) -> u64 {
        self.cfg.disk_reserve_bytes()
    }

    fn running(&self) -> bool {
        self.state.get() == State::Running && self.failed.borrow().is_none()
    }

    async fn check_self(&self) -> Result<super::SelfCheckReport> {
        self.self_check().await
    }
}

impl Store {
    /// Runs a retention pass now and returns what it did: expired segments go whatever
    /// the hour (RocketMQ's `executeDeleteFilesManually`; the disk levels apply as in
    /// any pass), then the queue and index files below the new minimum.
    pub async fn delete_expired_files(&self) -> Result<PassReport> {
        if self.inner.state.get() != State::Running {
            return Err(Error::ShutDown);
        }
        clean::pass(&*self.inner, true).await
    }

    /// The retention settings in use.
    pub fn retention_config(&self) -> crate::config::RetentionConfig {
        self.inner.clean.config()
    }

    /// Replaces the retention settings at run time (checked as at open; the next pass
    /// uses them, and one starts now). Not written anywhere: the configuration the
    /// store is opened with next decides then.
    pub fn set_retention_config(&self, cfg: crate::config::RetentionConfig) -> Result<()> {
        self.inner
            .clean
            .set_config(cfg, self.inner.cfg.disk_full_ratio)
    }

    /// The cleaner's counters and the disk level it last saw.
    pub fn retention_stats(&self) -> CleanStats {
        self.inner.clean.stats()
    }

    /// Deletes `topic`'s queues (module docs); returns how many this store held (0:
    /// none, and nothing is recorded). Its records stay in the log until retention
    /// removes them, invisible to gets and key queries; a look-up by offset or
    /// message id still finds them, as in RocketMQ.
    pub async fn delete_topic(&self, topic: &str) -> Result<usize> {
        let inner = &self.inner;
        if inner.state.get() != State::Running {
            return Err(Error::ShutDown);
        }
        if let Some(f) = inner.failed.borrow().clone() {
            return Err(Error::Failed(f));
        }
        self.wait_dispatched().await;
        let _round = inner.round_permit().await?;
        // One step, no await: from here dispatch skips the topic's records and puts
        // start new queues.
        if inner.queues.find_topic(topic).is_empty() {
            return Ok(0);
        }
        let below = inner.log.written();
        inner.clean.deleted.insert(topic, below);
        let removed = inner.queues.remove_topic(topic);
        inner.clean.deleted.persist().await?;
        for q in &removed {
            q.cq.destroy().await?;
        }
        let (dispatch_safe, flushed) = (inner.dispatched.get(), inner.log.flushed.get());
        let manifest = inner.queues.manifest(dispatch_safe);
        inner
            .flush_structures(flushed, manifest, IndexFlush::WhenDue)
            .await?;
        tracing::info!(topic, queues = removed.len(), below, "topic deleted");
        Ok(removed.len())
    }

    /// Deletes every topic this store holds that is not in `keep` (RocketMQ's
    /// `cleanUnusedTopic`), except system topics (`SCHEDULE_TOPIC_XXXX`, `rmq_sys_*`)
    /// and retry and dead-letter topics (`%RETRY%*`, `%DLQ%*`), which brokers do not
    /// list among their topics. Returns the topics deleted.
    pub async fn clean_unused_topics(&self, keep: &HashSet<String>) -> Result<Vec<String>> {
        let doomed: Vec<String> = self
            .inner
            .queues
            .topics()
            .into_iter()
            .filter(|t| !keep.contains(t) && !is_system_topic(t))
            .collect();
        let mut done = Vec::new();
        for t in doomed {
            if self.delete_topic(&t).await? > 0 {
                done.push(t);
            }
        }
        Ok(done)
    }

    /// The topics deleted from this store whose records are still in its log, with
    /// the offset below which they are gone.
    pub fn deleted_topics(&self) -> Vec<(String, u64)> {
        self.inner.clean.deleted.entries()
    }
}

/// Topics `clean_unused_topics` never deletes (see there).
pub fn is_system_topic(t: &str) -> bool {
    t == "SCHEDULE_TOPIC_XXXX"
        || t.starts_with("rmq_sys_")
        || t.starts_with("%RETRY%")
        || t.starts_with("%DLQ%")
}
