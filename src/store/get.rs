//! The read side: RocketMQ's `DefaultMessageStore.getMessage` (with its statuses and
//! next-begin-offset rules), `lookMessageByOffset`, `viewMessageById`, the min/max
//! offsets, `getOffsetInQueueByTime` and `getEarliestMessageTime`.
//!
//! Invariants: queue reads (`get`) see only dispatched records, reads by offset or
//! message id every record the log confirms (in sync-flush mode both only durable
//! ones); every record a `get` returns is verified (checksums, and that it is the
//! record of that queue position), so damaged bytes or a damaged queue entry give
//! `Error::Corrupt`, never another message.
//!
//! Decision: a read by offset does not wait for dispatch (RocketMQ's
//! `lookMessageByOffset` reads the CommitLog too), so an acknowledged put is found by
//! its id at once, also when dispatch lags or stopped after a failure. Where the bytes come from (windows, read
//! cache, disk) is the CommitLog's plan (`commit_log/read_plan.rs`).

use super::{Inner, Store};
use crate::consume_queue::ConsumeQueue;
use crate::error::{Error, Result};
use crate::format::consume_queue::CqEntry;
use crate::format::msg_id::MessageId;
use crate::format::record::{self, Decoded, Verify};
use crate::message::*;

impl Store {
    /// Up to `max_count` raw records of a queue from queue offset `offset`, stopping
    /// before `max_bytes` once at least one is taken, with RocketMQ's statuses and
    /// next-begin-offset rules.
    pub async fn get(
        &self,
        topic: &str,
        queue_id: i32,
        offset: QueueOffset,
        max_count: usize,
        max_bytes: usize,
    ) -> Result<GetResult> {
        let r = self
            .get_unrecorded(topic, queue_id, offset, max_count, max_bytes)
            .await;
        if let Ok(r) = &r {
            let bytes = r.records.iter().map(|b| b.len() as u64).sum();
            self.inner.stats.get(r.records.len() as u64, bytes);
        }
        r
    }

    async fn get_unrecorded(
        &self,
        topic: &str,
        queue_id: i32,
        offset: QueueOffset,
        max_count: usize,
        max_bytes: usize,
    ) -> Result<GetResult> {
        let inner = &self.inner;
        let mut r = GetResult {
            status: GetStatus::NoMatchedLogicQueue,
            next_begin_offset: 0,
            min_offset: 0,
            max_offset: 0,
            records: Vec::new(),
        };
        let Some(q) = inner.queues.find(topic, queue_id) else {
            return Ok(r);
        };
        let (min, max) = (q.cq.min_offset(), q.cq.max_offset());
        r.min_offset = min;
        r.max_offset = max;
        if max == 0 {
            r.status = GetStatus::NoMessageInQueue;
            return Ok(r);
        }
        if offset < min {
            r.status = GetStatus::OffsetTooSmall;
            r.next_begin_offset = min;
            return Ok(r);
        }
        if offset == max {
            r.status = GetStatus::OffsetOverflowOne;
            r.next_begin_offset = offset;
            return Ok(r);
        }
        if offset > max {
            r.status = GetStatus::OffsetOverflowBadly;
            r.next_begin_offset = max;
            return Ok(r);
        }
        let count = max_count.clamp(1, inner.cfg.max_get_count);
        let entries = q.cq.entries(offset, count).await?;
        if entries.is_empty() {
            let epf = inner.cfg.consume_queue_entries_per_file;
            r.status = GetStatus::OffsetFoundNull;
            r.next_begin_offset = offset + epf - offset % epf;
            return Ok(r);
        }
        // Take entries while the byte budget allows (at least one); the CommitLog plans
        // the reads of their records.
        let log_min = inner.log.min_offset();
        let mut taken = Vec::with_capacity(entries.len());
        let mut bytes = 0usize;
        let mut next = offset;
        for e in entries {
            if !taken.is_empty() && bytes + e.size as usize > max_bytes {
                break;
            }
            next += 1;
            if (e.phys_offset as u64) < log_min {
                continue;
            }
            bytes += e.size as usize;
            taken.push((next - 1, e));
        }
        r.next_begin_offset = next;
        if taken.is_empty() {
            r.status = GetStatus::MessageWasRemoving;
            return Ok(r);
        }
        r.records = match inner.read_records(topic, queue_id, &taken).await {
            Ok(records) => records,
            // Retention deleted a segment while this read waited (the log's minimum
            // moved past some of these records): the rest are read again, once.
            Err(_) if taken[0].1.phys_offset < inner.log.min_offset() as i64 => {
                let log_min = inner.log.min_offset() as i64;
                taken.retain(|(_, e)| e.phys_offset >= log_min);
                if taken.is_empty() {
                    r.status = GetStatus::MessageWasRemoving;
                    return Ok(r);
                }
                inner.read_records(topic, queue_id, &taken).await?
            }
            Err(e) => return Err(e),
        };
        r.status = GetStatus::Found;
        Ok(r)
    }

    /// Decodes the record at commit-log offset `offset`; `None` if no record starts there.
    pub async fn look_by_offset(&self, offset: LogOffset) -> Result<Option<StoredMessage>> {
        let raw = match self.read_record(offset).await? {
            Some(raw) => raw,
            None => return Ok(None),
        };
        Ok(StoredMessage::decode(&raw).ok())
    }

    /// The raw record at `offset`, verified; `None` if no valid record starts there.
    pub async fn read_record(&self, offset: LogOffset) -> Result<Option<bytes::Bytes>> {
        let log = &self.inner.log;
        // Offsets come from clients (message ids): no arithmetic may overflow.
        let visible = self.visible_end();
        let fits = |len: u64| offset.checked_add(len).is_some_and(|end| end <= visible);
        if offset < log.min_offset() || !fits(record::MIN_RECORD_LEN as u64) {
            return Ok(None);
        }
        // A direct read costs whole blocks anyway: the first read takes the rest of
        // the page (at least 1 KiB), which usually holds the whole record.
        let first = (4096 - offset % 4096).max(1024).min(visible - offset);
        let head = match log.read(offset, first as usize).await {
            Ok(head) => head,
            Err(_) if offset < log.min_offset() => return Ok(None),
            Err(e) => return Err(e),
        };
        let Ok((size, _)) = record::peek_header(&head) else {
            return Ok(None);
        };
        if size < record::MIN_RECORD_LEN as i32
            || size as usize > self.inner.cfg.max_record_bytes()
            || !fits(size as u64)
        {
            return Ok(None);
        }
        let raw = if size as usize <= head.len() {
            head.slice(..size as usize)
        } else {
            match log.read(offset, size as usize).await {
                Ok(raw) => raw,
                // Deleted by retention meanwhile.
                Err(_) if offset < log.min_offset() => return Ok(None),
                Err(e) => return Err(e),
            }
        };
        let verify = Verify::checksums(
            offset,
            self.inner.cfg.max_record_bytes(),
            log.requires_crc(offset),
        );
        match record::decode(&raw, verify) {
            Ok(Decoded::Record(_)) => Ok(Some(raw)),
            _ => Ok(None),
        }
    }

    /// Looks a message up by its 32-character offset message id.
    pub async fn look_by_msg_id(&self, id: &str) -> Result<Option<StoredMessage>> {
        match MessageId::parse(id) {
            Some(id) => self.look_by_offset(id.offset).await,
            None => Ok(None),
        }
    }

    /// Reads by offset see every record the log confirms (durable in sync mode,
    /// written in async mode), dispatched or not (module docs).
    fn visible_end(&self) -> u64 {
        self.inner.dispatched.get().max(self.inner.confirm_offset())
    }

    pub fn min_queue_offset(&self, topic: &str, queue_id: i32) -> QueueOffset {
        self.inner
            .queues
            .find(topic, queue_id)
            .map(|q| q.cq.min_offset())
            .unwrap_or(0)
    }

    /// The next queue offset to be consumed-visible (RocketMQ's max offset).
    pub fn max_queue_offset(&self, topic: &str, queue_id: i32) -> QueueOffset {
        self.inner
            .queues
            .find(topic, queue_id)
            .map(|q| q.cq.max_offset())
            .unwrap_or(0)
    }

    pub fn min_log_offset(&self) -> LogOffset {
        self.inner.log.min_offset()
    }

    pub fn max_log_offset(&self) -> LogOffset {
        self.inner.log.written()
    }

    pub fn flushed_log_offset(&self) -> LogOffset {
        self.inner.log.flushed.get()
    }

    pub fn committed_log_offset(&self) -> LogOffset {
        self.inner.log.committed.get()
    }

    pub fn dispatched_log_offset(&self) -> LogOffset {
        self.inner.dispatched.get()
    }

    /// Store time of the message at queue offset `q`; `i64::MIN` for an entry whose
    /// record retention deleted (the queue's minimum is moved after the log's).
    async fn store_time_at(&self, cq: &ConsumeQueue, q: u64) -> Result<Option<i64>> {
        let Some(e) = cq.entry(q).await? else {
            return Ok(None);
        };
        if (e.phys_offset as u64) < self.inner.log.min_offset() {
            return Ok(Some(i64::MIN));
        }
        let raw = self
            .inner
            .log
            .read(e.phys_offset as u64, e.size as usize)
            .await?;
        let born_v6 = crate::format::be_i32(&raw, record::SYSFLAG_AT).unwrap_or(0)
            & record::SYSFLAG_BORNHOST_V6
            != 0;
        let at = record::BORN_HOST_AT + if born_v6 { 20 } else { 8 };
        Ok(crate::format::be_i64(&raw, at))
    }

    /// The first queue offset whose message was stored at or after `timestamp_ms`
    /// (RocketMQ 5's LOWER boundary), clamped to [min, max].
    pub async fn queue_offset_by_time(
        &self,
        topic: &str,
        queue_id: i32,
        timestamp_ms: i64,
    ) -> Result<QueueOffset> {
        let Some(q) = self.inner.queues.find(topic, queue_id) else {
            return Ok(0);
        };
        let (mut lo, mut hi) = (q.cq.min_offset(), q.cq.max_offset());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.store_time_at(&q.cq, mid).await? {
                Some(t) if t < timestamp_ms => lo = mid + 1,
                _ => hi = mid,
            }
        }
        Ok(lo)
    }

    /// Store time of the queue's first message, or -1 when it has none.
    pub async fn earliest_message_time(&self, topic: &str, queue_id: i32) -> Result<i64> {
        let Some(q) = self.inner.queues.find(topic, queue_id) else {
            return Ok(-1);
        };
        if q.cq.min_offset() >= q.cq.max_offset() {
            return Ok(-1);
        }
        Ok(self
            .store_time_at(&q.cq, q.cq.min_offset())
            .await?
            .filter(|t| *t != i64::MIN)
            .unwrap_or(-1))
    }
}

impl Inner {
    /// Reads the records of `entries` (queue offset, entry) and verifies each one.
    async fn read_records(
        &self,
        topic: &str,
        queue_id: i32,
        entries: &[(QueueOffset, CqEntry)],
    ) -> Result<Vec<bytes::Bytes>> {
        self.log
            .read_records(
                self.read_cache.as_ref(),
                entries,
                |(_, e)| (e.phys_offset as u64, e.size as u64),
                |(qoff, e), raw| self.verify_entry_record(topic, queue_id, *qoff, e, raw),
            )
            .await
    }

    /// Checks that `raw` is the record of queue position `qoff` (checksums, topic,
    /// queue, queue offset and size): `Error::Corrupt` naming the segment otherwise.
    fn verify_entry_record(
        &self,
        topic: &str,
        queue_id: i32,
        qoff: QueueOffset,
        e: &CqEntry,
        raw: &[u8],
    ) -> Result<()> {
        let phys = e.phys_offset as u64;
        let verify = Verify::checksums(
            phys,
            self.cfg.max_record_bytes(),
            self.log.requires_crc(phys),
        );
        let kind = match record::decode(raw, verify) {
            Ok(Decoded::Record(v))
                if v.topic == topic
                    && v.queue_id == queue_id
                    && v.queue_offset == qoff as i64
                    && v.total_size == e.size as u32 =>
            {
                return Ok(());
            }
            Ok(_) => crate::format::Corruption::QueueMismatch,
            Err(k) => k,
        };
        let (path, offset) = self.log.locate(phys);
        tracing::error!(path = %path.display(), offset, %kind, topic, queue_id, qoff, "damaged record on read");
        Err(Error::Corrupt {
            path,
            offset,
            kind,
            detail: Some(format!(
                "record for {topic}/{queue_id} at queue offset {qoff}"
            )),
        })
    }
}
