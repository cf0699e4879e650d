//! Finds half messages left undecided: RocketMQ's
//! `TransactionalMessageServiceImpl.check`, one pass at a time, over any
//! [`StoreOps`] (the node runs a pass every `transaction_check_interval_ms`).
//!
//! A pass reads the op queue's new records into the set of decided half offsets, then
//! walks the half queue from the checker's progress:
//!
//! | half message at `q` | action | progress |
//! |---|---|---|
//! | decided (an op record names `q`) | none | past `q` |
//! | stored less than the timeout ago | the pass ends (later ones are newer) | stays at `q` |
//! | checked `check_max` times | copied to `CHECK_MAX_TOPIC`, then an op record for `q` | past `q` |
//! | otherwise | put back (a copy at the end, checks + 1), an op record for `q`, then the producer is asked about the copy | past `q` |
//!
//! A put that fails ends the pass with the progress at `q`: the next pass tries again.
//! Age is measured from the store timestamp (RocketMQ uses the producer's born
//! timestamp, which trusts the producer's clock). The decided set holds the op records
//! past the progress only; at start it is rebuilt by reading the op queue from its
//! first retained record, so a restart never asks about a decided message.

use super::{CHECK_MAX_TOPIC, HALF_TOPIC, OP_TOPIC, check_times, decided_offset};
use crate::error::Result;
use crate::message::{GetStatus, StoredMessage};
use crate::shard::StoreOps;
use bytes::Bytes;
use std::collections::BTreeSet;
use std::time::Duration;

/// Records read per `get`.
const BATCH: usize = 32;
const BATCH_BYTES: usize = 4 << 20;

/// The checker's limits (RocketMQ `transactionTimeOut`, `transactionCheckMax`).
#[derive(Debug, Clone, Copy)]
pub struct CheckRules {
    pub timeout: Duration,
    pub check_max: u32,
}

/// A check-back to send: the half message's put-back copy.
#[derive(Debug, Clone)]
pub struct CheckBack {
    /// The producer group to ask (`PGROUP`).
    pub group: String,
    /// The copy's queue offset in the half queue (`tranStateTableOffset`).
    pub queue_offset: u64,
    /// The copy's log offset (`commitLogOffset`).
    pub log_offset: u64,
    /// The half message as read (the request body; RocketMQ sends the record).
    pub record: Bytes,
    pub message: StoredMessage,
}

/// What a pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PassReport {
    pub checked: u64,
    pub discarded: u64,
    pub decided: u64,
    /// The half queue offset the next pass starts from.
    pub progress: u64,
}

/// The checker's memory between passes.
#[derive(Debug, Default)]
pub struct Checker {
    /// Half offsets decided by an op record, at or past the progress.
    decided: BTreeSet<u64>,
    /// The next op record to read; `None` before the first pass (then the op queue's
    /// first retained record).
    op_next: Option<u64>,
}

impl Checker {
    /// One pass from half queue offset `progress` at time `now_ms`; `ask` is called for
    /// each check-back (after its copy is stored).
    pub async fn pass<S: StoreOps>(
        &mut self,
        store: &S,
        progress: u64,
        rules: CheckRules,
        now_ms: i64,
        mut ask: impl FnMut(CheckBack),
    ) -> Result<PassReport> {
        self.read_ops(store).await?;
        let (min, _) = store.queue_offsets(HALF_TOPIC, 0).await?;
        let mut report = PassReport {
            progress: progress.max(min),
            ..PassReport::default()
        };
        'walk: loop {
            let r = store
                .get(HALF_TOPIC, 0, report.progress, BATCH, BATCH_BYTES)
                .await?;
            if r.status != GetStatus::Found {
                if r.status == GetStatus::OffsetTooSmall || r.status == GetStatus::OffsetFoundNull {
                    // Removed by retention (or a hole): go on from what is there.
                    if r.next_begin_offset > report.progress {
                        report.progress = r.next_begin_offset;
                        continue;
                    }
                }
                break;
            }
            for raw in &r.records {
                let m = match StoredMessage::decode(raw) {
                    Ok(m) => m,
                    Err(e) => {
                        tracing::error!(offset = report.progress, error = %e, "transaction check: a half record does not decode; skipped");
                        report.progress += 1;
                        continue;
                    }
                };
                let q = m.queue_offset;
                if self.decided.remove(&q) {
                    report.decided += 1;
                    report.progress = q + 1;
                    continue;
                }
                if now_ms
                    < m.store_timestamp_ms
                        .saturating_add(rules.timeout.as_millis() as i64)
                {
                    break 'walk;
                }
                if check_times(&m) >= rules.check_max {
                    let d = store.put(super::discarded(&m)).await;
                    if !d.status.is_stored() {
                        tracing::warn!(offset = q, status = ?d.status, "transaction check: cannot discard a half message yet");
                        break 'walk;
                    }
                    let op = store.put(super::op_record(q, m.born_host)).await;
                    if !op.status.is_stored() {
                        tracing::warn!(offset = q, status = ?op.status, "transaction check: discarded, but its op record was refused");
                    }
                    tracing::warn!(
                        offset = q,
                        group = m.property(super::PGROUP).unwrap_or(""),
                        checks = check_times(&m),
                        "transaction check: no answer after transactionCheckMax checks; discarded to {CHECK_MAX_TOPIC}"
                    );
                    report.discarded += 1;
                    report.progress = q + 1;
                    continue;
                }
                let back = store.put(super::put_back(&m)).await;
                if !back.status.is_stored() {
                    tracing::warn!(offset = q, status = ?back.status, "transaction check: cannot put a half message back yet");
                    break 'walk;
                }
                // The original is superseded by its copy: an op record for it keeps a
                // pass that starts behind (progress not yet persisted at a crash) from
                // putting it back a second time.
                let op = store.put(super::op_record(q, m.born_host)).await;
                if !op.status.is_stored() {
                    tracing::warn!(offset = q, status = ?op.status, "transaction check: put back, but the original's op record was refused");
                }
                report.checked += 1;
                report.progress = q + 1;
                ask(CheckBack {
                    group: m.property(super::PGROUP).unwrap_or("").to_string(),
                    queue_offset: back.queue_offset,
                    log_offset: back.log_offset,
                    record: raw.clone(),
                    message: m,
                });
            }
        }
        let keep = self.decided.split_off(&report.progress);
        self.decided = keep;
        Ok(report)
    }

    /// Adds the op records written since the last pass to the decided set.
    async fn read_ops<S: StoreOps>(&mut self, store: &S) -> Result<()> {
        let mut next = match self.op_next {
            Some(n) => n,
            None => store.queue_offsets(OP_TOPIC, 0).await?.0,
        };
        loop {
            let r = store.get(OP_TOPIC, 0, next, BATCH, BATCH_BYTES).await?;
            if r.status != GetStatus::Found {
                if r.next_begin_offset > next
                    && matches!(
                        r.status,
                        GetStatus::OffsetTooSmall | GetStatus::OffsetFoundNull
                    )
                {
                    next = r.next_begin_offset;
                    continue;
                }
                break;
            }
            for raw in &r.records {
                match StoredMessage::decode(raw) {
                    Ok(m) => match decided_offset(&m.body) {
                        Some(q) => {
                            self.decided.insert(q);
                        }
                        None => tracing::error!(
                            offset = m.queue_offset,
                            "transaction check: an op record's body is not a queue offset; ignored"
                        ),
                    },
                    Err(e) => {
                        tracing::error!(offset = next, error = %e, "transaction check: an op record does not decode; ignored")
                    }
                }
            }
            next = r.next_begin_offset;
        }
        self.op_next = Some(next);
        Ok(())
    }
}
