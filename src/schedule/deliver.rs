//! One delivery: RocketMQ's `ScheduleMessageService.messageTimeUp` (and the timer's
//! `convertMessage`): the scheduled record put again, into its real queue, on the
//! shard that owns it.
//!
//! The delivered message keeps the scheduled record's body, flag, sysflag, born time
//! and host, reconsume times and every property (`UNIQ_KEY` among them, so clients
//! see the id they were given at send time; `DELAY`, `REAL_TOPIC`, `REAL_QID`,
//! `TIMER_OUT_MS` stay, as on RocketMQ's disk: `format::schedule`), goes to
//! `REAL_TOPIC`/`REAL_QID`, never waits for a sync flush, and carries its position
//! first (`store/delivered.rs`). A message whose real topic is the transaction half
//! topic is dropped, as RocketMQ drops it.
//!
//! Exactly once, across shards. Each lane delivers one message at a time, in order,
//! and after a crash resumes after the newest delivery held by any shard's log. A log
//! keeps a prefix of what was written, so within one shard that is exact. Across
//! shards it is exact because a lane switches shards only once the shard it delivered
//! to last holds those deliveries durably (flushed), and delivers to another shard
//! only once the scheduled record itself is durable here: no later delivery can
//! survive a crash that an earlier one (or the record it came from) did not. A run of
//! deliveries to one shard pays for one flush at its end.

use super::host::Host;
use crate::format::schedule::{Position, REAL_QID, REAL_TOPIC};
use crate::message::{Message, PutStatus, StoredMessage};

/// The transaction half topic: a scheduled message naming it is dropped.
const TRANS_HALF_TOPIC: &str = "RMQ_SYS_TRANS_HALF_TOPIC";

/// What became of one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Stored in its real queue.
    Delivered,
    /// Cannot ever be delivered (why); the lane moves on, as RocketMQ 5 does.
    Skipped(String),
    /// Not now (why): try the same one again later.
    Retry(String),
}

/// The message a scheduled record becomes, and where it goes; `Err` when it cannot be
/// delivered.
pub(crate) fn delivery_of(r: &StoredMessage) -> Result<Message, String> {
    let topic = r
        .property(REAL_TOPIC)
        .ok_or_else(|| format!("record at {} has no {REAL_TOPIC}", r.log_offset))?;
    let queue_id: i32 = r
        .property(REAL_QID)
        .and_then(|q| q.trim().parse().ok())
        .ok_or_else(|| format!("record at {} has no valid {REAL_QID}", r.log_offset))?;
    if topic == TRANS_HALF_TOPIC {
        return Err(format!(
            "record at {} names the transaction half topic",
            r.log_offset
        ));
    }
    Ok(Message {
        topic: topic.to_string(),
        queue_id,
        flag: r.flag,
        body: r.body.clone(),
        properties: r.properties.clone(),
        born_timestamp_ms: r.born_timestamp_ms,
        born_host: r.born_host,
        sys_flag: r.sys_flag,
        reconsume_times: r.reconsume_times,
        prepared_transaction_offset: 0,
    })
}

/// Delivers one lane's messages, one at a time (module docs).
pub(crate) struct Deliverer<H: Host> {
    host: H,
    /// The shard holding this lane's newest deliveries not yet known durable, and (for
    /// this shard) the log offset they end at.
    unflushed: Option<(usize, u64)>,
}

impl<H: Host> Deliverer<H> {
    pub(crate) fn new(host: H) -> Deliverer<H> {
        Deliverer {
            host,
            unflushed: None,
        }
    }

    /// Makes this shard's log durable up to `end`.
    async fn local_durable(&self, end: u64) -> Result<(), String> {
        let here = self.host.shard();
        if self.host.store().flushed_log_offset() >= end {
            return Ok(());
        }
        self.host
            .flush(here)
            .await
            .map_err(|e| format!("flush of shard {here} failed: {e}"))
    }

    /// Before a delivery to `target`: the lane's earlier deliveries, when they went
    /// elsewhere, and (for another shard) the scheduled record ending at `record_end`
    /// are made durable, so no later delivery can outlive them (module docs).
    async fn before(&mut self, target: usize, record_end: u64) -> Result<(), String> {
        if self.unflushed.is_some_and(|(shard, _)| shard != target) {
            self.settle().await?;
        }
        if target != self.host.shard() {
            self.local_durable(record_end).await?;
        }
        Ok(())
    }

    /// Makes every delivery so far durable (the timer, before it saves its manifest).
    pub(crate) async fn settle(&mut self) -> Result<(), String> {
        match self.unflushed {
            None => return Ok(()),
            Some((shard, end)) if shard == self.host.shard() => self.local_durable(end).await?,
            Some((shard, _)) => self
                .host
                .flush(shard)
                .await
                .map_err(|e| format!("flush of shard {shard} failed: {e}"))?,
        }
        self.unflushed = None;
        Ok(())
    }

    /// Delivers the scheduled record `r` as position `pos`.
    pub(crate) async fn deliver(&mut self, r: &StoredMessage, pos: Position) -> Outcome {
        let msg = match delivery_of(r) {
            Ok(m) => m,
            Err(why) => return Outcome::Skipped(why),
        };
        let target = self.host.owner(&msg.topic, msg.queue_id);
        let record_end = r.log_offset + r.size as u64;
        if let Err(why) = self.before(target, record_end).await {
            return Outcome::Retry(why);
        }
        let result = self.host.put_delivery(target, msg, pos).await;
        match result.status {
            s if s.is_stored() => {
                let end = result.log_offset + result.wrote_bytes as u64;
                self.unflushed = Some((target, end));
                Outcome::Delivered
            }
            PutStatus::MessageIllegal(why) => {
                Outcome::Skipped(format!("the real queue refuses it: illegal ({why:?})"))
            }
            PutStatus::PropertiesSizeExceeded => {
                Outcome::Skipped("its properties are too long for the real queue".into())
            }
            other => Outcome::Retry(format!("put to shard {target}: {other:?}")),
        }
    }
}
